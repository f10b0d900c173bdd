"""Trackio runs: every logged step written before the process ends.

trackio (0.40 to 0.43) queues each `log()` and a daemon thread writes the queue to the
project's sqlite database (TRACKIO_DIR/<project>.db) every 0.5 s; `finish()` stops
that thread once it has written the rest. Its one exit hook, an atexit callback,
finishes the run `trackio.init` made current in the main thread's context. A SIGTERM
loses what is still queued (the process dies of the signal after our teardown,
before atexit callbacks).

Trackio stores no end state (no status, no exit code): ending a run is writing all
of it. We wrap `Run.__init__`, finish() each run the user has not finished at exit,
then take trackio's atexit callback off: it could only finish one of ours again
and print its "Run finished" line twice. A fork child drops its copy of that
callback, which would "finish" the parent's run there (that line, nothing written).
"""

import atexit
import sys

from .. import engine, registry
from . import Patches, contract, recording, supported

NAME = KIND = "trackio"
ORDER = 27  # a local write: before mlflow (28) and wandb (30), whose ends can take seconds
_patches = Patches()
get_version, unpatch = contract(NAME, _patches)


def patch():
    if _patches or not supported(NAME):
        return
    from trackio import context_vars
    from trackio.run import Run

    _patches.wrap(Run, "__init__", recording(lambda run: registry.record(KIND, run)))
    engine.register_kind(KIND, ORDER, finish_run, after_all=drop_exit_hook, in_child=drop_exit_hook)
    run = context_vars.current_run.get()  # a run started before we were imported
    if run is not None:
        registry.record(KIND, run)


def finish_run(run, timeout):
    if not run._stop_flag.is_set():  # set by finish(): the user's, or a tracker's
        run.finish()


def drop_exit_hook(_):
    hook = getattr(sys.modules.get("trackio"), "_cleanup_current_run", None)
    if hook is not None:
        atexit.unregister(hook)


def describe(run):
    return f"run {run.name} in project {run.project}"
