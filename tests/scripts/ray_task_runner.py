"""A verl-style driver: a TaskRunner actor owns a StatefulDataLoader with workers
and a wandb run (offline); the driver gets its result and then either simply
ends or ends the actor with __ray_terminate__ or SIGTERM. Usage:
ray_task_runner.py end|terminate|sigterm|detached-job|detached-option
(detached-job: the job's default_actor_lifetime is "detached"; detached-option:
lifetime="detached"; either way the driver simply ends and the actor lives on,
on a cluster started separately.)

Prints the actor's pid, its DataLoader workers' and wandb-core's pids, and the
number of steps it logged. With GO_FILE set, it then prints READY and waits for that file
before it ends (a test makes the W&B server fail meanwhile)."""

import os
import sys
import time

import ray

STEPS = 20


@ray.remote(num_cpus=1)
class TaskRunner:
    def run(self):
        import psutil
        import wandb
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.loader = StatefulDataLoader(list(range(1000)), batch_size=4, num_workers=2)
        self.batches = iter(self.loader)
        self.tracker = wandb.init(project="autoteardown-tests")
        for step in range(STEPS):
            next(self.batches)
            self.tracker.log({"loss": 1.0 / (step + 1)})
        children = [p.pid for p in psutil.Process().children(recursive=True)]
        return os.getpid(), children


mode = sys.argv[1]
job = {}
if mode == "detached-job":
    from ray.job_config import JobConfig

    job = {"job_config": JobConfig(default_actor_lifetime="detached")}
if os.environ.get("RAY_ADDRESS"):  # a cluster started separately: its workers need our wandb settings
    wandb_env = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
    ray.init(runtime_env={"env_vars": wandb_env}, **job)
else:
    ray.init(num_cpus=2, include_dashboard=False, **job)
runner = (TaskRunner.options(lifetime="detached") if mode == "detached-option" else TaskRunner).remote()
actor_pid, children = ray.get(runner.run.remote())
print("ACTOR:", actor_pid)
print("CHILDREN:", *children)
print("STEPS:", STEPS, flush=True)
if os.environ.get("GO_FILE"):
    print("READY", flush=True)
    while not os.path.exists(os.environ["GO_FILE"]):
        time.sleep(0.05)
print("END:", time.monotonic(), flush=True)  # for the exit-time benchmark
if mode in ("terminate", "sigterm"):
    if mode == "terminate":
        runner.__ray_terminate__.remote()
    else:  # as Ray's raylet does to a worker it stops
        os.kill(actor_pid, 15)
    from procs import running

    deadline = time.monotonic() + 15
    while running(actor_pid):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print("ACTOR_GONE:", not running(actor_pid), flush=True)
