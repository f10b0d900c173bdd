"""Ray Tune's logger callbacks that keep a run in an actor of their own: the experiment's end
waits for runs that were told to end.

Tune tells a trial's logging actor to end (its END message: the actor finishes its run) only from
`log_trial_end`. An experiment stopped by Ctrl-C ends its trials without it, and
`on_experiment_end` then waits `upload_timeout` (30 min by default) for actors nobody told to end,
and kills them with their runs unfinished. The rule: when the experiment ends, every logging actor
it is about to wait for has been sent Tune's own END, as its `log_trial_end` and `__del__` do. An
actor already told never reads the second message (it stopped reading at the first).
"""

from .. import log
from ..patches import Patches

WANDB = "ray.air.integrations.wandb"
_patches: "Patches | None" = None  # the ray integration's


def patch(patches: Patches) -> None:
    from .. import importhook

    global _patches
    _patches = patches
    importhook.register(WANDB, "autoteardown.integrations.ray_tune:patch_wandb")


def patch_wandb(module) -> None:
    if _patches is not None:
        _patches.wrap(module.WandbLoggerCallback, "on_experiment_end", _every_actor_told_to_end)


def _every_actor_told_to_end(wrapped, instance, args, kwargs):
    for trial in list(getattr(instance, "_trial_queues", None) or ()):
        try:
            instance._signal_logging_actor_stop(trial)
        except Exception:  # its queue's actor is gone: Tune's own wait and kill follow
            log.debug_exception("could not tell the logging actor of %s to end", trial)
    return wrapped(*args, **kwargs)
