"""An unmodified script logging to SwanLab (offline), Trackio (local), Comet (an
OfflineExperiment) or Aim (a repository), in TRACKER_DIR, or to ClearML (a task on the
server CLEARML_API_HOST names).
Usage: tracker_job.py LIBRARY WHAT ENDING

LIBRARY: swanlab, trackio, comet, aim, clearml.
WHAT:    one (a run never ended); loader (the same, stepping a StatefulDataLoader with
         2 workers, as the issue measured); finished (the user ends the run, then the
         script ends: the run is left as the user ended it); fork (a raw fork child
         ends normally, then the parent logs STEPS more); tracker (verl-style: a module
         global owns the run and ends it only in __del__); ray (verl's topology: a
         TaskRunner actor of a local Ray owns the run and a StatefulDataLoader with 2
         workers, the driver gets its result and ends; prints "ACTOR: pid");
         late_import (the run starts before `import autoteardown`); slow_end (comet: the
         script ends the experiment in a `finally:`, and that end's archive upload, comet's
         set_offline_zip_uploader, takes SLOW_END seconds).
ENDING:  normal, raise, exit3, interrupt, sigterm (prints READY and waits): endings.py.

Logs one scalar "loss" per step, STEPS steps of 0.1 s. Prints which autoteardown it
runs ("AUTOTEARDOWN: file") and whether the run class is patched ("PATCHED: bool").
"""

import os
import sys
import time

import endings  # tests/scripts is sys.path[0]
import wrapt

STEPS = 8
library, what, ending = sys.argv[1:4]
folder = os.environ["TRACKER_DIR"]

if library == "swanlab":
    import swanlab

    def start():
        return swanlab.init(mode="offline", log_dir=folder, project="autoteardown-tests")

    def end(run):
        run.finish()
elif library == "comet":
    import comet_ml

    def start():
        return comet_ml.OfflineExperiment(project_name="autoteardown-tests", offline_directory=folder,
                                          display_summary_level=0, log_env_details=False, log_git_metadata=False,
                                          log_git_patch=False, log_code=False)

    def end(run):
        run.end()
elif library == "aim":
    import aim

    def start():
        return aim.Run(repo=folder, experiment="autoteardown-tests", system_tracking_interval=None,
                       log_system_params=False, capture_terminal_logs=False)

    def end(run):
        run.close()
elif library == "clearml":
    from clearml import Task  # its server: CLEARML_API_HOST (tests/clearml_server.py's stand-in)

    def start():  # as verl's ClearMLLogger, without the repository detection: its `git` (a thread's
        # Popen) races the fork of clearml's reporting subprocess, which can inherit the pipe that
        # Popen waits on, and close() or the exit then waits for ever (1 run in 5 here, without the shim too).
        return Task.init(project_name="autoteardown-tests", task_name=what, continue_last_task=True,
                         output_uri=False, auto_connect_frameworks={"detect_repository": False})

    def end(run):
        run.close()
else:
    import trackio  # its folder: TRACKIO_DIR

    def start():
        return trackio.init(project="autoteardown-tests")

    def end(run):
        trackio.finish()


def log(run, steps):
    for step in steps:
        if what in ("loader", "ray"):
            next(batches)
        if library == "comet":
            run.log_metric("loss", 1.0 / (step + 1), step=step)
        elif library == "aim":
            run.track(1.0 / (step + 1), name="loss", step=step)
        elif library == "clearml":
            run.get_logger().report_scalar("loss", "loss", 1.0 / (step + 1), iteration=step)
        else:
            run.log({"loss": 1.0 / (step + 1)}, step=step)
        time.sleep(0.1)  # a training step: trackio's sender writes every 0.5 s in between


class Tracker:
    """As verl's Tracking: holds the run and ends it only when collected."""

    def __init__(self):
        self.run = start()

    def __del__(self):
        end(self.run)




def loader():
    from torchdata.stateful_dataloader import StatefulDataLoader

    return iter(StatefulDataLoader(list(range(1000)), batch_size=4, num_workers=2))


if what == "loader":
    batches = loader()
if what == "ray":
    import ray

    @ray.remote(num_cpus=1)
    class TaskRunner:
        def run(self):
            global batches
            batches = loader()
            self.run = start()
            log(self.run, range(STEPS))
            return os.getpid()

    ray.init(num_cpus=2, include_dashboard=False)
    runner = TaskRunner.remote()  # kept, as verl does (a dropped handle kills the actor at once)
    print("ACTOR:", ray.get(runner.run.remote()), flush=True)
    sys.exit(0)
if what == "tracker":
    TRACKER = Tracker()
    run = TRACKER.run
else:
    run = start()
if what == "late_import":
    import autoteardown  # noqa: F401  (from PYTHONPATH, not the sitecustomize)
owner = {"swanlab": "swanlab.sdk.internal.run:Run", "trackio": "trackio.run:Run",
         "comet": "comet_ml.experiment:CometExperiment", "aim": "aim.sdk.run:Run",
         "clearml": "clearml.task:Task:init"}[library].split(":")
print("AUTOTEARDOWN:", getattr(sys.modules.get("autoteardown"), "__file__", None), flush=True)
init = vars(getattr(sys.modules[owner[0]], owner[1]))[owner[2] if owner[2:] else "__init__"]  # aim's: functools.wraps
print("PATCHED:", isinstance(init, wrapt.FunctionWrapper), flush=True)  # our wrapper (aim has its own functools one)
log(run, range(STEPS))
if what == "finished":
    end(run)
if what == "fork":
    child = os.fork()
    if child == 0:
        sys.exit(0)  # a raw fork child ending through the normal exit path
    os.waitpid(child, 0)
    log(run, range(STEPS, 2 * STEPS))
if what == "slow_end":
    run.set_offline_zip_uploader(lambda path: time.sleep(float(os.environ["SLOW_END"])))
    try:
        endings.end(ending)
    finally:
        end(run)
endings.end(ending)
