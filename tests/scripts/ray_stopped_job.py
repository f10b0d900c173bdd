"""A verl-shaped job that is stopped from outside: the driver waits in
`ray.get(runner.run.remote(config))` (as verl's main_ppo.run_ppo does) while a
TaskRunner actor trains: a StatefulDataLoader with 2 workers and a wandb run
(offline) held on `self`, STEPS steps at PAUSE s. The test SIGTERMs the driver or
the whole process group part-way. Usage: ray_stopped_job.py [steps] [pause] [tracker]
(tracker: wandb, the default; mlflow with MLFLOW_TRACKING_URI set; tensorboard
with TB_LOGDIR set; checkpoint: no tracker, an async torch.distributed.checkpoint save
of 100 MB to CKPT_DIR/ckpt at the start, through a storage that waits SLOW_WRITE_S before
it writes).

The driver prints "LOGS: dir" (Ray's log folder); the actor prints "ACTOR: pid",
"CHILDREN: pids" (loader workers, wandb-core),
"RUN: id" (mlflow) and "STEP: n" after each step is logged; Ray forwards them to
the driver's stdout."""

import os
import sys
import time

import ray

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
PAUSE = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
TRACKER = sys.argv[3] if len(sys.argv) > 3 else "wandb"


def say(text):
    sys.stdout.write(text + "\n")  # one write: Ray forwards each write as lines of its own
    sys.stdout.flush()


@ray.remote(num_cpus=1)
class TaskRunner:
    def run(self, config):
        import psutil
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.loader = StatefulDataLoader(list(range(10000)), batch_size=4, num_workers=2)
        self.batches = iter(self.loader)
        if config["tracker"] == "mlflow":
            import mlflow

            self.tracker = mlflow.start_run()
            say(f"RUN: {self.tracker.info.run_id}")
            log = lambda step: mlflow.log_metric("loss", 1.0 / (step + 1), step=step)  # noqa: E731
        elif config["tracker"] == "checkpoint":
            import torch.distributed as dist
            import torch.distributed.checkpoint as dcp

            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from checkpoint_job import SlowWriter, state

            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            writer = SlowWriter(os.path.join(os.environ["CKPT_DIR"], "ckpt"))
            self.saving = dcp.async_save(state(0, 100), storage_writer=writer)
            log = lambda step: None  # noqa: E731
        elif config["tracker"] == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.tracker = SummaryWriter(os.environ["TB_LOGDIR"], flush_secs=3600)  # nothing flushed by itself
            log = lambda step: self.tracker.add_scalar("loss", 1.0 / (step + 1), step)  # noqa: E731
        else:
            import wandb

            self.tracker = wandb.init(project="autoteardown-tests")
            log = lambda step: self.tracker.log({"loss": 1.0 / (step + 1)})  # noqa: E731
        children = " ".join(str(p.pid) for p in psutil.Process().children(recursive=True))
        say(f"ACTOR: {os.getpid()}\nCHILDREN: {children}")
        for step in range(config["steps"]):
            next(self.batches)
            log(step)
            say(f"STEP: {step}")
            time.sleep(config["pause"])
        return "done"


ray.init(num_cpus=2, include_dashboard=False)
print("DRIVER:", os.getpid(), flush=True)
print("LOGS:", ray._private.worker._global_node.get_logs_dir_path(), flush=True)  # the raylet's log, for the test
runner = TaskRunner.remote()
print("RESULT:", ray.get(runner.run.remote({"steps": STEPS, "pause": PAUSE, "tracker": TRACKER})), flush=True)
