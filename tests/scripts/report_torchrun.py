"""One rank of a torchrun job, unmodified: a gloo process group, a DataLoader with 2 workers
and a wandb run per rank; it trains until stopped (the test SIGTERMs torchrun after both
ranks print READY)."""

import os
import time

import torch.distributed as dist
import wandb
from torch.utils.data import DataLoader

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
batches = iter(DataLoader(list(range(10_000)), batch_size=8, num_workers=2))
run = wandb.init(project="autoteardown-tests", name=f"rank-{rank}")
for _ in range(5):
    run.log({"loss": float(next(batches).float().mean())})
# One write, so the two ranks' lines never interleave on torchrun's shared stdout.
pids = " ".join(str(w.pid) for w in batches._workers)
os.write(1, f"PIDS: {os.getpid()} {pids}\nREADY {rank}\n".encode())
while True:
    next(batches)
    time.sleep(0.02)
