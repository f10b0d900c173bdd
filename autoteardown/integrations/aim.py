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

`close()` leaves the run's two write containers (its meta and its sequences) open in the
repository's pool: aim closes them from its atexit callback too, and their `progress` flag
files, which `Repo.list_active_runs()` and aim's UI read as "this run is active", go only
then. So they are closed here after the run, as that callback would.
"""

import os

from .. import registry
from ..patches import Patches
from . import OneEndAtATime, kind_of, recording

KIND = kind_of(__name__)  # relies on AutoClean._finalizers (3.29) for a run made before us
ENDS = OneEndAtATime()  # close(): ours and the program's never at once


def patch(patches: Patches) -> None:
    from aim.ext.cleanup import AutoClean
    from aim.sdk.run import BasicRun, Run

    patches.wrap(Run, "__init__", recording(_record))
    patches.wrap(BasicRun, "close", ENDS)  # Run inherits it
    for made in list(getattr(AutoClean, "_finalizers", ())):
        if isinstance(made, Run):
            _record(made)


def _record(run) -> None:
    if not getattr(run, "read_only", True):  # a reader's runs have nothing to close
        registry.record(KIND, run)


def finalize_one(run, timeout: float) -> None:
    with ENDS.held(run):
        lock = getattr(getattr(getattr(run, "_lock", None), "_sf_lock", None), "lock_file", None)
        still_open = getattr(run, "_resources", None) is not None  # else closed: its lock released
        repo = getattr(run, "repo", None)
        run.close()
    _close_containers(repo, getattr(run, "hash", None))
    if lock is not None and still_open:
        try:
            os.remove(lock)
        except FileNotFoundError:  # released after all (closed in the thread that opened it)
            pass


def _close_containers(repo, run_hash) -> None:
    """Close the run's write containers in the repository's pool (their keys: name, sub, read_only)."""
    pool = getattr(repo, "container_pool", None)
    for config, container in list(pool.items()) if pool is not None and run_hash else ():
        if getattr(config, "sub", None) == run_hash and getattr(config, "read_only", True) is False:
            container.close()


def describe(run) -> str:
    return f"run {getattr(run, 'hash', '?')} in {getattr(getattr(run, 'repo', None), 'path', '?')}"
