"""SwanLab runs: finish each one with the state the process really ends with.

swanlab (0.9.8 to 0.10.3) finishes its run from hooks that `Run.__init__` sets:
an atexit callback (finish(), "success"), `sys.excepthook` ("crashed", or
"aborted" for KeyboardInterrupt, then the previous hook prints the traceback)
and a SIGINT handler ("aborted"). A SIGTERM runs none of them, and the run's
writer flushes only in finish() (the process dies of the signal after our
teardown, before atexit callbacks); `sys.exit(3)` reaches only the atexit
callback, which says FINISHED.

We wrap `Run.__init__` and finish every run still alive at exit (before atexit):
"success" for status 0, "crashed" with the reason for an exception or a non-zero
status, "aborted" for SIGTERM or KeyboardInterrupt. An uncaught exception reaches
swanlab's excepthook first, which finishes the run as without us and prints the
one traceback; we leave it, as any run the user finished, alone. finish() takes
swanlab's atexit callback off, so nothing finishes a run twice. No fork callback:
a fork child's registry starts empty, and swanlab's `alive` is False there (pid).
"""

import threading
import traceback

from .. import exitstatus, registry, signals
from ..patches import Patches
from . import OneEndAtATime, kind_of, recording

KIND = kind_of(__name__)
ENDS = OneEndAtATime()  # finish(): ours and the program's never at once


def patch(patches: Patches) -> None:
    from swanlab.sdk.internal.run import Run, get_run

    patches.wrap(Run, "__init__", recording(lambda run: registry.record(KIND, run)))
    patches.wrap(Run, "finish", ENDS)
    try:  # a run started before we were imported
        registry.record(KIND, get_run())
    except RuntimeError:
        pass


def _state():
    """(state, error) for finish(), from how the process ends."""
    code, exception, why = exitstatus.ending()
    if isinstance(exception, KeyboardInterrupt) or signals.received() is not None:
        return "aborted", why
    if exception is not None:
        return "crashed", "".join(traceback.format_exception(exception))
    return ("success", None) if code == 0 else ("crashed", f"{why}: exit status {code}")


def finalize_one(run, timeout: float) -> None:
    with ENDS.held(run):
        if not run.alive:
            return  # finished: by the user, by swanlab's excepthook or SIGINT handler
        if threading.current_thread() is not threading.main_thread():
            # finish() puts SIGINT's handler back when the run began in the main thread,
            # which raises in ours; swanlab's handler, left in place, hands a later
            # SIGINT to the one before it once the run has ended.
            run._is_main_thread = False
        state, error = _state()
        run.finish(state=state, error=error)


def describe(run) -> str:
    return f"run {run.id} ({run.mode}) in {run.dir}"
