"""Comet experiments: end each one at exit, so that what it logged is written or sent.

comet_ml (3.58) ends an experiment from an atexit callback (`_on_end`), which a SIGTERM never
reaches: the process dies of the signal after our teardown, before atexit callbacks. An
`OfflineExperiment` then leaves an empty archive, an online `Experiment` its last data unsent.
We record every experiment at `CometExperiment.__init__` (also the one running when we are
imported) and end each one still alive at exit with `end()`, which takes comet's atexit
callback off. An uncaught exception is reported by comet's own excepthook, as without us.
No fork callback: comet's atexit callback does nothing in another process (it checks the pid),
and a fork child's registry starts empty.
"""

from .. import registry
from ..patches import Patches
from . import OneEndAtATime, kind_of, recording

KIND = kind_of(__name__)  # public names only; tested on 3.58
ENDS = OneEndAtATime()  # end(): ours and the program's never at once


def patch(patches: Patches) -> None:
    from comet_ml import experiment
    from comet_ml.config import get_running_experiment

    patches.wrap(experiment.CometExperiment, "__init__", recording(lambda exp: registry.record(KIND, exp)))
    patches.wrap(experiment.CometExperiment, "end", ENDS)
    running = get_running_experiment()  # one made before we were imported
    if running is not None:
        registry.record(KIND, running)


def finalize_one(exp, timeout: float) -> None:
    with ENDS.held(exp):
        if getattr(exp, "alive", False):  # else ended by the user, or it never started
            exp.end()


def describe(exp) -> str:
    offline = getattr(exp, "offline_directory", None)
    return f"experiment {getattr(exp, 'id', '?')}" + (f" (offline, in {offline})" if offline else "")
