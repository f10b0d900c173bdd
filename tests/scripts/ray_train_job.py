"""A Ray Train job: a TorchTrainer with 2 CPU workers whose train function keeps
a StatefulDataLoader iterator (2 workers) on a long-lived object and logs 10
steps to wandb (offline) on rank 0, never calling finish(). Usage:
ray_train_job.py return|raise|hang|other-rank-raises
(raise: rank 0 raises after its steps, rank 1 returns; hang: both loop after
their steps until the driver is stopped with SIGTERM; other-rank-raises: rank 1
raises once rank 0 has logged 6 steps; rank 0 logs one each batch, waiting in
next() for its slow dataset.) Legacy v1 reserves a CPU for its trainer actor:
the workers take half a CPU each.

Each rank writes OUT_DIR/rank<N>: its pid and its children's (DataLoader
workers, wandb-core); the driver prints "FIT: ok|failed <error type>".
RAY_TRAIN_V2_ENABLED=0 selects the legacy Train (v1)."""

import json
import os
import sys
import tempfile
import time

import ray

MODE = sys.argv[1]
STEPS = 10


class Slow:
    """A dataset whose items take 50 ms: a rank spends its steps waiting in next()."""

    def __len__(self):
        return 100000

    def __getitem__(self, index):
        time.sleep(0.05)
        return index


def write_rank(rank):
    import psutil

    children = [p.pid for p in psutil.Process().children(recursive=True)]
    out = os.path.join(os.environ["OUT_DIR"], f"rank{rank}")
    with open(out + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "children": children}, f)
    os.replace(out + ".tmp", out)


def train_func():
    import ray.train
    import wandb
    from torchdata.stateful_dataloader import StatefulDataLoader

    import __main__

    rank = ray.train.get_context().get_world_rank()
    data = Slow() if MODE == "other-rank-raises" else list(range(1000))
    loader = StatefulDataLoader(data, batch_size=4, num_workers=2)
    __main__.KEEP = iter(loader)  # long-lived, as a trainer's attribute would be
    if rank == 0:
        __main__.RUN = wandb.init(project="autoteardown-tests")
    if MODE == "other-rank-raises":
        write_rank(rank)
        for step in range(300):
            next(__main__.KEEP)
            logged = os.path.join(os.environ["OUT_DIR"], "step5-logged")
            if rank == 0:
                __main__.RUN.log({"loss": 1.0 / (step + 1)})
                print(f"RANK0_STEP: {step}", flush=True)
                if step == 5:
                    open(logged, "w").close()
            elif os.path.exists(logged):  # rank 0 is well into its loop (wandb.init is slow)
                raise RuntimeError("rank 1 failed")
    for step in range(STEPS):
        next(__main__.KEEP)
        if rank == 0:
            __main__.RUN.log({"loss": 1.0 / (step + 1)})
    import torch.distributed

    torch.distributed.barrier()  # both ranks have done their steps (rank 0 its wandb.init)
    write_rank(rank)
    if MODE == "raise" and rank == 0:
        raise RuntimeError("the training function failed")
    while MODE == "hang":
        time.sleep(0.1)


ray.init(num_cpus=2, include_dashboard=False)
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
                       run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="atd-train-")))
print("FIT: start", flush=True)
try:
    trainer.fit()
    print("FIT: ok", flush=True)
except Exception as exc:
    print("FIT: failed", type(exc).__name__, flush=True)
