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
for step in range(5):
    run.log({"loss": float(next(batches).float().mean())})
print(f"PIDS: {os.getpid()} " + " ".join(str(w.pid) for w in batches._workers), flush=True)
print(f"READY {rank}", flush=True)
while True:
    next(batches)
    time.sleep(0.02)
