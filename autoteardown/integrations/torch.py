"""DataLoader worker iterators: shut their workers down before torch's exit hook, after
which `_shutdown_workers()` does nothing and multiprocessing SIGTERMs the workers.

Iterators are recorded where `__iter__` and torchdata's `state_dict()` make them
(`_get_iterator`), and told apart by their `_workers` (torchdata's is a copy of
torch's, not a subclass). multiprocessing's fd handoff with a worker is a critical
section for the SIGTERM unwind (signals.py): cut half-way, the worker raises.
"""

import sys
import threading
import time

from .. import cpython, log, processes, registry
from ..patches import Patches
from . import kind_of, recording

KIND = kind_of(__name__)
TARGETS = (
    ("torch.utils.data.dataloader", "DataLoader"),
    ("torchdata.stateful_dataloader.stateful_dataloader", "StatefulDataLoader"),
)
WORKER_GRACE = 0.5  # for an idle worker to leave, and for a SIGKILLed one to die
_EXITCODE_WORDS = {0: "stopped", -15: "ended by SIGTERM", -9: "killed (SIGKILL)"}


def patch(patches: Patches) -> None:
    for module_name, class_name in TARGETS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is not None and "_get_iterator" not in vars(cls):  # torch has no upper bound in TABLE
            log.warning_once("%s has no _get_iterator (unsupported version); DataLoader workers are left alone",
                             class_name, tree=True)
        elif cls is not None:
            patches.wrap(cls, "_get_iterator", recording(_record))
    from multiprocessing import resource_sharer

    from .. import signals

    patches.wrap(resource_sharer.DupFd, "detach", signals.critical)


def _record(it):
    if getattr(it, "_workers", None):  # no workers, nothing to shut down
        registry.record(KIND, it)


def in_child(it) -> None:
    # Its events and queues are the parent's: mark it done so the child never shuts it
    # down, and take the parent's workers off multiprocessing's list, which would SIGTERM them.
    it._shutdown = True
    it._worker_pids_set = False
    cpython.disown(getattr(it, "_workers", ()))


def on_sigterm(it) -> None:
    # Workers dying with the process are no error to report (torch's _shutdown_workers() does this first).
    if getattr(it, "_worker_pids_set", False):
        it._worker_pids_set = False  # first: a second call must not remove them twice (torch raises)
        sys.modules["torch.utils.data._utils.signal_handling"]._remove_worker_pids(id(it))


def finalize_one(it, timeout: float) -> None:
    """End the workers as this process would end them without the shim, never sooner, and
    within `timeout`; quietly (their pids are taken off torch's SIGCHLD check before any
    signal: no "killed by signal").

    - Each worker is told to stop (the done event, then its last index): an idle one leaves
      within WORKER_GRACE; a busy one after the item it is loading.
    - Where the process would let a busy worker finish its item (torch's own graceful shutdown
      comes first: its persistent-workers atexit; or this process ends from a SIGTERM of its
      own, which leaves the workers to finish as orphans), it gets the time torch's shutdown
      gives it (MP_STATUS_CHECK_INTERVAL): a write in flight completes.
    - Where the process would SIGTERM it (multiprocessing's exit at a normal end: the item
      dies with it), it is SIGTERMed now. torch's worker handler makes that a quiet exit 0; a
      handler of the worker's own has the rest of the budget to finish, as multiprocessing's
      join would let it, unless a worker died holding the lock they share with this process
      (below): then no handler can finish.
    - SIGKILL comes only at the end of the budget.

    A worker ended so can die holding a lock it shares with this process: the done event's, which
    it takes to read the event; torch's shutdown sets the event again and would wait on that lock
    for ever. The event is set before any worker is signalled, so torch's shutdown is handed an
    already-set event of this process's own: the workers keep theirs."""
    if getattr(it, "_shutdown", True):
        return
    grace, deadline = min(WORKER_GRACE, timeout / 2), time.monotonic() + timeout * 0.8
    try:
        # As torch does: the pin-memory thread first, since workers exiting can leave
        # half-written data in the queue it reads.
        thread = getattr(it, "_pin_memory_thread", None)
        if thread is not None:
            it._pin_memory_thread_done_event.set()
            it._worker_result_queue.put((None, None))
            thread.join(grace)
        shared = it._workers_done_event
        shared.set()
        it._workers_done_event = threading.Event()  # from here on this process waits on the shared lock only bounded
        it._workers_done_event.set()
        for worker_id, _ in enumerate(it._workers):
            if it._persistent_workers or it._workers_status[worker_id]:
                it._mark_worker_as_unavailable(worker_id, shutdown=True)
        busy = {info[0] for info in getattr(it, "_task_info", {}).values() if len(info) == 1}
        idle_until = time.monotonic() + grace
        busy_until = min(deadline, time.monotonic() + _busy_grace(it))
        for worker_id, w in enumerate(it._workers):
            w.join(max(0.0, (busy_until if worker_id in busy else idle_until) - time.monotonic()))
        left = [w for w in it._workers if w.exitcode is None]
        if left:
            on_sigterm(it)
            # Its own handler has the rest of the budget, unless no handler can finish.
            processes.terminate(left, max(grace, deadline - time.monotonic()), lambda: _lock_lost(shared, grace))
            log.debug("ended %d DataLoader worker(s) loading items nobody will read", len(busy))
    except Exception:
        log.debug_exception("early stop of %r failed; torch's shutdown follows", it)
    it._shutdown_workers()  # torch's bookkeeping


def _lock_lost(event, wait: float) -> bool:
    """Did a worker die holding the lock of the done event it shares with this process (a SIGTERM
    inside `is_set()`)? Every worker that reads the event then waits for ever: no handler of its own
    can finish, and the rest of the budget would be spent for nothing."""
    lock = getattr(getattr(event, "_cond", None), "_lock", None)
    if lock is None:
        return False
    if lock.acquire(timeout=wait):
        lock.release()
        return False
    return True


def _busy_grace(it) -> float:
    """How long a busy worker may finish its item: torch's shutdown's own wait where the process
    would let it (see finalize_one), else nothing."""
    from .. import signals  # loaded by then: the process is armed

    dataloader = sys.modules.get("torch.utils.data.dataloader")
    atexit_set = getattr(dataloader, "_persistent_workers_atexit", None)  # torch >= 2.13
    graceful = it in atexit_set if atexit_set is not None else it._persistent_workers and it._pin_memory
    if not graceful and signals.received() is None:
        return 0.0
    return float(getattr(sys.modules.get("torch.utils.data._utils"), "MP_STATUS_CHECK_INTERVAL", 5.0))


def describe(it) -> str:
    workers = list(getattr(it, "_workers", None) or ())
    loader = "StatefulDataLoader" if "Stateful" in type(it).__name__ else "DataLoader"
    if not workers:
        return f"{loader} (no workers)"
    states = []
    for w in workers:
        try:
            code = w.exitcode  # None while alive; only the parent can ask
        except Exception:
            code = None
        states.append(None if code is None else _EXITCODE_WORDS.get(code, f"exit {code}"))
    if len(set(states)) == 1:
        detail = "pid " + ", ".join(str(w.pid) for w in workers) + (f": {states[0]}" if states[0] else "")
    else:
        detail = ", ".join(f"pid {w.pid}: {state or 'running'}" for w, state in zip(workers, states, strict=True))
    return f"{loader} with {len(workers)} worker(s) ({detail})"
