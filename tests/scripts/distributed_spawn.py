"""An unmodified 2-rank gloo job started with torch.multiprocessing.spawn; no rank
destroys its process group. Usage: distributed_spawn.py PORT

Each rank's atexit hook is registered after init_process_group, so it runs after
autoteardown's exit hook and reports whether the group was still alive there."""

import atexit
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank):
    dist.init_process_group("gloo", rank=rank, world_size=2)
    total = torch.ones(1)
    dist.all_reduce(total)
    atexit.register(lambda: print(f"RANK {rank} AT EXIT: initialized={dist.is_initialized()}", flush=True))
    print(f"RANK {rank} PID: {os.getpid()} SUM: {int(total.item())}", flush=True)


if __name__ == "__main__":
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    mp.spawn(train, nprocs=2)  # raises if a rank's status is not 0
    print("ALL RANKS DONE", flush=True)
