"""An unmodified rank script that never destroys its process groups (gloo, env://:
run by torchrun, or with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set).
Usage: distributed_job.py MODE
  normal    both ranks end normally
  subgroup  a new_group() too
  apart     the ranks end for different reasons, 2 s apart: rank 0 calls
            sys.exit(3) at once (taking its TCPStore with it), rank 1 raises later
  stuck     rank 1 raises while rank 0 waits in an all_reduce that never completes

The atexit hook is registered after init_process_group, so it runs after
autoteardown's exit hook (which comes before any atexit callback) and reports
whether the groups were still alive there."""

import atexit
import os
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
if mode == "subgroup":
    subgroup = dist.new_group([0, 1])
total = torch.ones(1)
dist.all_reduce(total)


def report():
    # False once the default group is destroyed (and with it every subgroup).
    print(f"RANK {rank} AT EXIT: initialized={dist.is_initialized()}", flush=True)


atexit.register(report)
print(f"RANK {rank} PID: {os.getpid()} SUM: {int(total.item())}", flush=True)
if mode == "apart":
    if rank == 0:
        sys.exit(3)
    time.sleep(2)
    raise ValueError("the user's own error")
if mode == "stuck":
    if rank == 1:
        raise ValueError("the user's own error")
    dist.all_reduce(total)
