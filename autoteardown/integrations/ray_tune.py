"""Ray Tune's logger callbacks: when an experiment ends, no trial's run is left open.

Tune ends a trial's run only from the callback's `log_trial_end`. An experiment stopped by
Ctrl-C ends its trials without it, so their runs stay open: MLflow's RUNNING for good, and
WandbLoggerCallback's logging actors, never sent their END message, are waited for
`upload_timeout` (30 min by default) by its `on_experiment_end`, then killed with their runs
unfinished. The rule, applied once where Tune calls every callback's `on_experiment_end`
(`CallbackList`), before any of them runs: each run Tune left open is ended as Tune ends runs,
and marked as stopped where the tracker has a word for it.

- WandbLoggerCallback: every logging actor is sent Tune's own END (as its `log_trial_end` and
  `__del__` do; an actor already told never reads a second one): it finishes its run.
- MLflowLoggerCallback: a trial's run still RUNNING is ended KILLED (Tune ends the others
  FINISHED or FAILED).

A second rule, for WandbLoggerCallback wherever Tune ends a logging actor: an actor whose run
is finished is killed only once the run is on disk. `wandb.finish()` returns before wandb-core
has written the run's last records; Tune `ray.kill`s the actor as soon as its `run()` returns,
and Ray kills the actor's children (wandb-core) with it, so the run can lose its tail or the
whole file. `wandb.teardown()` in the actor waits for wandb-core to write out and stop; it is
run there first (bounded by AUTOTEARDOWN_RAY_GRACE_S), then Tune's kill follows unchanged.
"""

import sys

from .. import config, deadlines, log
from ..patches import Patches
from . import mlflow


# The ray integration's `later` triggers (integrations.TABLE): called when Tune's modules are imported.
def patch_callbacks(module, patches: Patches) -> None:
    patches.wrap(module.CallbackList, "on_experiment_end", _ending_open_runs_first)


def patch_wandb_logger(module, patches: Patches) -> None:
    if "wandb" not in config.DISABLED_INTEGRATIONS:
        patches.wrap(module.WandbLoggerCallback, "_cleanup_logging_actor", _written_out_before_kill)


def _ending_open_runs_first(wrapped, instance, args, kwargs):
    for callback in list(getattr(instance, "_callbacks", None) or ()):
        for (module_name, class_name, tracker), end_open_runs in ENDERS.items():
            cls = getattr(sys.modules.get(module_name), class_name, None)
            if cls is not None and isinstance(callback, cls) and tracker not in config.DISABLED_INTEGRATIONS:
                end_open_runs(callback)
    return wrapped(*args, **kwargs)


def _tell_logging_actors_to_end(callback) -> None:
    for trial in list(getattr(callback, "_trial_queues", None) or ()):
        try:
            callback._signal_logging_actor_stop(trial)
        except Exception:  # its queue's actor is gone: Tune's own wait and kill follow
            log.debug_exception("could not tell the logging actor of %s to end", trial)


def _written_out_before_kill(wrapped, instance, args, kwargs):
    trial = args[0] if args else kwargs.get("trial")
    try:
        import ray

        future = instance._trial_logging_futures.get(trial)
        if future is not None and ray.wait([future], timeout=0)[0]:  # run() returned: its run is finished
            actor = instance._trial_logging_actors[trial]
            ray.get(actor.__ray_call__.remote(_WRITE_OUT), timeout=deadlines.grace())
    except Exception:  # not written out in time, or the actor is gone: Tune's kill as without us
        log.debug_exception("the logging actor of %s did not write its run out", trial)
    return wrapped(*args, **kwargs)


def _make_write_out():
    # A closure: cloudpickle ships it by value, to actors that may not have autoteardown.
    def write_out(_actor) -> None:
        import wandb

        try:
            wandb.teardown()
        except SystemExit:  # raised with wandb-core's status when it is not 0: nothing more to write
            pass

    return write_out


_WRITE_OUT = _make_write_out()


def _end_running_runs_killed(callback) -> None:
    util = callback.mlflow_util
    with mlflow.bounded(deadlines.tune_runs_end()):  # all of them: a tracking server may be gone
        for trial, run_id in list((getattr(callback, "_trial_runs", None) or {}).items()):
            try:
                if util._get_client().get_run(run_id).info.status == "RUNNING":
                    util.end_run(status="KILLED", run_id=run_id)
            except Exception:
                log.debug_exception("could not end the mlflow run of %s", trial)


# (module, callback class, the tracker's integration: disabled, its runs are left alone) -> ender
ENDERS = {
    ("ray.air.integrations.wandb", "WandbLoggerCallback", "wandb"): _tell_logging_actors_to_end,
    ("ray.air.integrations.mlflow", "MLflowLoggerCallback", "mlflow"): _end_running_runs_killed,
}
