"""An unmodified script logging to mlflow (MLFLOW_TRACKING_URI: a sqlite store or a
tracking server). Usage: mlflow_job.py WHAT ENDING

WHAT:   one (mlflow.start_run() with no `with` block); thread (the run is started and
        logged to in another thread, which ends first); tracker (verl-style: a module
        global starts the run and ends it only in __del__); nested (a parent and a
        nested child, both left open); ended (the user ends one run with
        end_run("FAILED") and another with MlflowClient().set_terminated(id, "KILLED"),
        that one left on mlflow's active-run stack).
ENDING: normal, raise, exit3, interrupt, sigterm (prints READY and waits),
        gone (prints READY, waits for the file MLFLOW_JOB_GO, made by the test once
        the tracking server is gone or stopped, then ends normally).

Each run logs METRICS values of "loss". Prints "RUN: id" for each run.
"""

import os
import sys
import threading
import time

import mlflow

METRICS = 10
what, ending = sys.argv[1], sys.argv[2]


def log(run_id=None):
    for step in range(METRICS):
        if run_id is None:
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        else:
            mlflow.MlflowClient().log_metric(run_id, "loss", 1.0 / (step + 1), step=step)


def start(**kwargs):
    run = mlflow.start_run(**kwargs)
    log()
    print("RUN:", run.info.run_id, flush=True)
    return run


class Tracker:
    """As verl's and SkyRL's trackers: the run is ended only when the tracker is collected."""

    def __init__(self):
        mlflow.start_run(run_name="tracker")
        self.mlflow = mlflow

    def log(self, data, step):
        self.mlflow.log_metrics(data, step=step)

    def __del__(self):
        self.mlflow.end_run()


if what == "one":
    start()
elif what == "thread":
    worker = threading.Thread(target=start)
    worker.start()
    worker.join()
elif what == "tracker":
    TRACKER = Tracker()
    for step in range(METRICS):
        TRACKER.log({"loss": 1.0 / (step + 1)}, step)
    print("RUN:", mlflow.active_run().info.run_id, flush=True)
elif what == "nested":
    start()
    start(nested=True)
elif what == "ended":
    start()
    mlflow.end_run("FAILED")
    run = start()
    mlflow.MlflowClient().set_terminated(run.info.run_id, "KILLED")

if ending == "raise":
    raise ValueError("the user's own error")
if ending == "exit3":
    sys.exit(3)
if ending == "interrupt":
    raise KeyboardInterrupt
if ending == "sigterm":
    print("READY", flush=True)
    while True:
        time.sleep(0.1)
if ending == "gone":
    print("READY", flush=True)
    go = os.environ["MLFLOW_JOB_GO"]  # the test makes this file once the server is gone
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    print("END:", time.monotonic(), flush=True)
