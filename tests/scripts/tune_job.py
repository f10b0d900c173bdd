"""Ray Tune, two trials (a grid of 2) of STEPS steps at 0.1 s, each logging through one of Tune's
logger callbacks; the test stops the driver mid-trial.
Usage: tune_job.py [wandb|wandb-unwritten|mlflow|comet|aim]: WandbLoggerCallback (offline),
MLflowLoggerCallback on sqlite in TUNE_DIR, CometLoggerCallback (OfflineExperiments in
TUNE_DIR/comet), or AimLoggerCallback (a repository in TUNE_DIR/aim). wandb-unwritten: each logging actor's wandb-core
writes its run out only when the process tears wandb down (wandb.finish() returns before the run
is on disk; here the stream is never closed at finish, so that window stays open).

TUNE_DIR: the experiment's storage and wandb's directory; each trial touches `step5-<x>` there
at its sixth step. TUNE_STEPS: each trial's steps (40). UPLOAD_TIMEOUT: the callback's `upload_timeout` (what Tune waits at the end).
MLFLOW_TRACKING_URI: a tracking server instead of the sqlite file. TUNE_QUIET_AFTER=n: each trial
reports n results, then waits without reporting (Tune then calls no tracker until it ends).
TUNE_ENDING=raise: trial x=2 raises after 8 results; TUNE_ENDING=early: the scheduler stops
trial x=2 after 8 results (as ASHA stops a trial whose loss is the higher). Prints READY before fit(), FIT_RETURNED <monotonic time> after it."""

import os
import sys
import time

import ray
import ray.train
from ray import tune

STEPS = int(os.environ.get("TUNE_STEPS", "40"))
report = getattr(tune, "report", None) or ray.train.report  # tune.report from ray 2.4x
RunConfig = getattr(tune, "RunConfig", None) or ray.train.RunConfig


def trainable(config):
    for step in range(STEPS):
        if step == int(os.environ.get("TUNE_QUIET_AFTER", STEPS)):
            time.sleep(600)
        if step == 5:
            open(os.path.join(os.environ["TUNE_DIR"], f"step5-{config['x']}"), "w").close()
        report({"loss": config["x"] * step})
        if step == 7 and config["x"] == 2 and os.environ.get("TUNE_ENDING") == "raise":
            raise RuntimeError("the trial's own error")
        time.sleep(0.1)


ray.init(num_cpus=2, include_dashboard=False)
if sys.argv[1:] == ["mlflow"]:
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.environ['TUNE_DIR']}/mlflow.db"
    callback = MLflowLoggerCallback(tracking_uri=uri,
                                    experiment_name="autoteardown-tune")
elif sys.argv[1:] == ["aim"]:
    from ray.tune.logger.aim import AimLoggerCallback

    callback = AimLoggerCallback(repo=os.path.join(os.environ["TUNE_DIR"], "aim"), experiment_name="autoteardown-tune",
                                 system_tracking_interval=None, log_system_params=False, capture_terminal_logs=False)
elif sys.argv[1:] == ["comet"]:
    from ray.air.integrations.comet import CometLoggerCallback

    callback = CometLoggerCallback(online=False, offline_directory=os.path.join(os.environ["TUNE_DIR"], "comet"),
                                   project_name="autoteardown-tune", display_summary_level=0)
else:
    from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor

    class UnwrittenLoggingActor(_WandbLoggingActor):
        def run(self):
            from wandb.sdk.lib.service import service_connection

            service_connection.ServiceConnection.inform_finish = lambda connection, run_id: None
            return super().run()

    if sys.argv[1:] == ["wandb-unwritten"]:
        WandbLoggerCallback._logger_actor_cls = UnwrittenLoggingActor
    callback = WandbLoggerCallback(project="autoteardown-tune", mode="offline",
                                   upload_timeout=int(os.environ.get("UPLOAD_TIMEOUT", "60")))
scheduler = None
if os.environ.get("TUNE_ENDING") == "early":
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    class StopEarly(FIFOScheduler):
        def on_trial_result(self, tune_controller, trial, result):
            if trial.config["x"] == 2 and result["training_iteration"] >= 8:
                return TrialScheduler.STOP
            return TrialScheduler.CONTINUE

    scheduler = StopEarly()
tuner = tune.Tuner(trainable, param_space={"x": tune.grid_search([1, 2])},
                   tune_config=tune.TuneConfig(scheduler=scheduler),
                   run_config=RunConfig(storage_path=os.environ["TUNE_DIR"], name="exp", callbacks=[callback]))
print("READY", flush=True)
tuner.fit()
print("FIT_RETURNED", time.monotonic(), flush=True)
