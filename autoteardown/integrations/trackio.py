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

from .. import registry
from ..patches import Patches
from . import OneEndAtATime, kind_of, recording

KIND = kind_of(__name__)
ENDS = OneEndAtATime()  # finish(): ours and the program's never at once


def patch(patches: Patches) -> None:
    from trackio import context_vars
    from trackio.run import Run

    patches.wrap(Run, "__init__", recording(lambda run: registry.record(KIND, run)))
    patches.wrap(Run, "finish", ENDS)
    run = context_vars.current_run.get()  # a run started before we were imported
    if run is not None:
        registry.record(KIND, run)


def finalize_one(run, timeout: float) -> None:
    with ENDS.held(run):
        if not run._stop_flag.is_set():  # set by finish(): the user's, or a tracker's
            run.finish()


def drop_exit_hook(_=None) -> None:
    """Take trackio's atexit callback off: after our finish(), and in a fork child."""
    hook = getattr(sys.modules.get("trackio"), "_cleanup_current_run", None)
    if hook is not None:
        atexit.unregister(hook)


after_all = in_child = drop_exit_hook


def describe(run) -> str:
    return f"run {run.name} in project {run.project}"
