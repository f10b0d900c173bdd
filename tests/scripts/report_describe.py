"""Real resources named by autoteardown.report.describe(), then a report written through
report's own calls (as the engine makes them). Prints "KIND: name" lines. Run with
AUTOTEARDOWN_DISABLE=1 (nothing patched: only the report module is under test).
Usage: report_describe.py FOLDER  (tensorboard logs, the mlflow store)."""

import os
import signal
import sys

folder = sys.argv[1]

from autoteardown import report  # noqa: E402


def show(kind, obj):
    print(f"{kind}: {report.describe(kind, obj)}", flush=True)


report.header("import")

import torch  # noqa: E402,F401
from torch.utils.data import DataLoader  # noqa: E402

batches = iter(DataLoader(list(range(1000)), batch_size=4, num_workers=2))
next(batches)
show("dataloader", batches)
report.begin("SIGTERM", 143)
batches._shutdown_workers()
report.step("dataloader", batches, "finalized", 0.01)
show("dataloader", batches)
other = iter(DataLoader(list(range(1000)), batch_size=4, num_workers=2))
next(other)
torch.utils.data._utils.signal_handling._remove_worker_pids(id(other))  # no SIGCHLD error for this one
os.kill(other._workers[0].pid, signal.SIGKILL)
other._workers[0].join(10)
show("dataloader", other)
other._workers[1].kill()
other._workers[1].join(10)

import wandb  # noqa: E402

run = wandb.init(project="autoteardown-tests", name="describe-me")
show("wandb", run)
child = os.fork()
if child == 0:  # private attributes only: a fork child must not talk to the parent's run
    print(f"fork child wandb: {report.describe('wandb', run)}", flush=True)
    os._exit(0)
os.waitpid(child, 0)
run.finish()
report.step("wandb", run, "finalized", 0.02)
report.step("wandb", None, "failed: RuntimeError: injected", 0.03)

import torch.distributed as dist  # noqa: E402

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29511"))
dist.init_process_group("gloo", rank=0, world_size=1)
group = dist.group.WORLD
show("process_group", group)
dist.destroy_process_group()
show("process_group", group)

from torch.utils.tensorboard import SummaryWriter  # noqa: E402

writer = SummaryWriter(os.path.join(folder, "tb"))
show("tensorboard", writer)
writer.close()

import mlflow  # noqa: E402

mlflow.set_tracking_uri(f"sqlite:///{os.path.join(folder, 'mlflow.db')}")
active = mlflow.start_run(run_name="described")
show("mlflow", active)
mlflow.end_run()

import ray  # noqa: E402

ray.init(num_cpus=1, include_dashboard=False)


@ray.remote
class Trainer:
    def pid(self):
        return os.getpid()


actor = Trainer.remote()
print("ACTOR:", ray.get(actor.pid.remote()), flush=True)
show("ray", actor)
print(f"actor id: {actor._ray_actor_id.hex()}", flush=True)
ray.shutdown()

show("ray", object())
show("nonesuch", 42)


class Broken:
    @property
    def _settings(self):
        raise RuntimeError("no settings")


print(f"broken wandb: {report.describe('wandb', Broken())}", flush=True)
report.step("ray", actor, "left behind", 5.0)
report.end(5.06)
report.begin("finalize()", 0)
report.end(0.0)  # a second teardown with nothing to do: no second JSON line
print("DONE", flush=True)
