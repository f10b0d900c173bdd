"""Aim runs: each run still open is closed at exit, so it is finished and its lock released.

aim (3.29) closes a run from its own atexit callback (`AutoClean.cleanup`), which a SIGTERM
never reaches: the process dies of the signal, and the run stays "in progress" in the
repository, its `.softlock` left behind. A Ray actor's process at its driver's end gets no
atexit either. We record each run made for writing at `Run.__init__` (also one already
open when we are imported, from aim's own cleanup list) and `close()` each one at exit:
its public end, which does nothing for a run already closed. Aim keeps no failed state:
a closed run is finished, as aim's own callback leaves it.

The run's lock is a thread-local file lock (filelock's default): released from the
teardown's runner thread it stays held, so its file is removed here, as its release in
the opening thread would.
"""

import os

from .. import registry
from ..patches import Patches
from . import kind_of, recording

KIND = kind_of(__name__)  # relies on AutoClean._finalizers (3.29) for a run made before us


def patch(patches: Patches) -> None:
    from aim.ext.cleanup import AutoClean
    from aim.sdk.run import Run

    patches.wrap(Run, "__init__", recording(_record))
    for made in list(getattr(AutoClean, "_finalizers", ())):
        if isinstance(made, Run):
            _record(made)


def _record(run) -> None:
    if not getattr(run, "read_only", True):  # a reader's runs have nothing to close
        registry.record(KIND, run)


def finalize_one(run, timeout: float) -> None:
    lock = getattr(getattr(getattr(run, "_lock", None), "_sf_lock", None), "lock_file", None)
    still_open = getattr(run, "_resources", None) is not None  # else closed: its lock released
    run.close()
    if lock is not None and still_open:
        try:
            os.remove(lock)
        except FileNotFoundError:  # released after all (closed in the thread that opened it)
            pass


def describe(run) -> str:
    return f"run {getattr(run, 'hash', '?')} in {getattr(getattr(run, 'repo', None), 'path', '?')}"
