"""A training script as a scheduler stops it: a wandb run (offline) and a DataLoader with 2
workers; it logs a step every 50 ms, for ever. Each rank of a torchrun job (RANK set) has its
own run, named rank<RANK>. Prints PIDS: (the DataLoader workers), CORE: (wandb-core), one
LOGGED <rank> <step> line after each step, READY <rank> after the 10th."""

import os
import time

import psutil
import torch
from torch.utils.data import DataLoader

rank = os.environ.get("RANK", "0")
batches = iter(DataLoader(list(range(1_000_000)), batch_size=4, num_workers=2))
next(batches)

import wandb  # noqa: E402

run = wandb.init(project="autoteardown-tests", name=f"rank{rank}")
me = psutil.Process().pid
cores = [p.pid for p in psutil.process_iter(["name", "ppid"]) if p.info["ppid"] == me and p.info["name"] == "wandb-core"]
# One write a line: torchrun's ranks share one stdout.
os.write(1, f"PIDS: {' '.join(str(w.pid) for w in batches._workers)}\nCORE: {' '.join(map(str, cores))}\n".encode())
step = 0
while True:
    next(batches)
    run.log({"x": torch.tensor(float(step)).item()})
    os.write(1, f"LOGGED {rank} {step}\n".encode())
    step += 1
    if step == 10:
        os.write(1, f"READY {rank}\n".encode())
    time.sleep(0.05)
