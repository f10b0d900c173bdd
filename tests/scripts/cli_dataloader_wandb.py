"""An unmodified script: a DataLoader with 2 workers and a wandb run that logs STEPS
steps, then trains on until it is stopped (the test sends SIGTERM after READY).
Usage: cli_dataloader_wandb.py [spawn]  (spawn: the workers are started by spawn and the
script ends normally after the steps)."""

import sys
import time

import psutil
import torch  # noqa: F401
import wandb
from torch.utils.data import DataLoader

STEPS = 10

if __name__ == "__main__":
    spawn = sys.argv[1:] == ["spawn"]
    loader = DataLoader(list(range(10_000)), batch_size=8, num_workers=2,
                        multiprocessing_context="spawn" if spawn else None)
    batches = iter(loader)
    run = None if spawn else wandb.init(project="autoteardown-tests")
    for _ in range(STEPS):
        batch = next(batches)
        if run is not None:
            run.log({"loss": float(batch.float().mean())})
    print("PIDS:", *[w.pid for w in batches._workers], flush=True)
    cores = [p.pid for p in psutil.process_iter(["name", "ppid"]) if p.info["ppid"] == psutil.Process().pid and p.info["name"] == "wandb-core"]
    print("CORE:", *cores, flush=True)
    print("READY", flush=True)
    if not spawn:
        while True:
            next(batches)
            time.sleep(0.02)
