"""A Ray actor logs to mlflow (MLFLOW_TRACKING_URI, inherited by the local Ray's
workers) and never ends its run; the driver gets the run id and simply exits.
Prints "RUN: id" and "ACTOR: pid"."""

import os

import ray

METRICS = 10


@ray.remote(num_cpus=1)
class Trainer:
    def train(self):
        import mlflow

        run = mlflow.start_run(run_name="in-actor")
        for step in range(METRICS):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        return run.info.run_id, os.getpid()


ray.init(num_cpus=2, include_dashboard=False)
trainer = Trainer.remote()
run_id, pid = ray.get(trainer.train.remote())
print("RUN:", run_id)
print("ACTOR:", pid, flush=True)
