"""A Ray Train job: a TorchTrainer with 2 CPU workers whose train function keeps
a StatefulDataLoader iterator (2 workers) on a long-lived object and logs 10
steps to wandb (offline) on rank 0, never calling finish(). Usage:
ray_train_job.py return|raise|hang|other-rank-raises|tree|checkpoint
(raise: rank 0 raises after its steps, rank 1 returns; hang: both loop after
their steps until the driver is stopped with SIGTERM; other-rank-raises: rank 1
raises once rank 0 has logged 6 steps; rank 0 logs one each batch, waiting in
next() for its slow dataset; tree: each rank also starts a multiprocessing spawn child (as
vLLM's engine core) whose subprocess starts a process in a new session, and returns; the
driver then waits for every rank's children to be gone, up to 2 x AUTOTEARDOWN_RAY_GRACE_S + 10 s, and prints
"TREE_LEFT: pids" before it ends; checkpoint: as hang, each rank first starting an async
torch.distributed.checkpoint save of its 50 MB shard to OUT_DIR/../ckpt through a storage
that waits SLOW_WRITE_S before it writes.) Legacy v1 reserves a CPU for its trainer actor:
the workers take half a CPU each.

Each rank writes OUT_DIR/rank<N>: its pid and its children's (DataLoader
workers, wandb-core); the driver prints "FIT: ok|failed <error type>".
RAY_TRAIN_V2_ENABLED=0 selects the legacy Train (v1)."""

import json
import os
import sys
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
    if MODE == "tree":  # the engine core: a spawn child whose subprocess starts a worker in a new session
        import multiprocessing
        import subprocess

        import psutil

        sleeper = "import time\nwhile True: time.sleep(0.1)"
        engine = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True)\n"
        __main__.CORE = multiprocessing.get_context("spawn").Process(
            target=subprocess.call, args=([sys.executable, "-c", engine + sleeper],), daemon=True)
        __main__.CORE.start()
        while len(psutil.Process(__main__.CORE.pid).children(recursive=True)) < 2:
            time.sleep(0.05)
    if MODE == "checkpoint":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import torch.distributed.checkpoint as dcp
        from checkpoint_job import SlowWriter, state

        folder = os.path.join(os.path.dirname(os.environ["OUT_DIR"]), "ckpt")
        __main__.SAVING = dcp.async_save(state(rank, 50), storage_writer=SlowWriter(folder))
    write_rank(rank)
    if MODE == "raise" and rank == 0:
        raise RuntimeError("the training function failed")
    while MODE in ("hang", "checkpoint"):
        time.sleep(0.1)


ray.init(num_cpus=2, include_dashboard=False)
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
                       run_config=RunConfig(storage_path=os.path.join(os.path.dirname(os.environ["OUT_DIR"]), "storage")))
print("FIT: start", flush=True)
try:
    trainer.fit()
    print("FIT: ok", flush=True)
except Exception as exc:
    print("FIT: failed", type(exc).__name__, flush=True)
if MODE == "tree":
    import json

    import psutil

    def left():
        pids = []
        for name in os.listdir(os.environ["OUT_DIR"]):
            if name.startswith("rank") and not name.endswith(".tmp"):
                pids += json.load(open(os.path.join(os.environ["OUT_DIR"], name)))["children"]
        return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    until = time.monotonic() + 2 * float(os.environ.get("AUTOTEARDOWN_RAY_GRACE_S", "5")) + 10
    while left() and time.monotonic() < until:
        time.sleep(0.1)
    print("TREE_LEFT:", *left(), flush=True)
