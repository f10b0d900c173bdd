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

from .. import log, registry
from ..patches import Patches
from . import kind_of, recording

KIND = kind_of(__name__)
TARGETS = (
    ("torch.utils.data.dataloader", "DataLoader"),
    ("torchdata.stateful_dataloader.stateful_dataloader", "StatefulDataLoader"),
)
WORKER_GRACE = 0.5  # for an idle worker to leave, and for a SIGTERMed one to die
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
    children: set = getattr(sys.modules.get("multiprocessing.process"), "_children", set())
    for worker in getattr(it, "_workers", ()):
        children.discard(worker)


def on_sigterm(it) -> None:
    # Workers dying with the process are no error to report (torch's _shutdown_workers() does this first).
    if getattr(it, "_worker_pids_set", False):
        it._worker_pids_set = False  # first: a second call must not remove them twice (torch raises)
        sys.modules["torch.utils.data._utils.signal_handling"]._remove_worker_pids(id(it))


def finalize_one(it, timeout: float) -> None:
    """Tell every worker to stop and end it at once if it is loading an item: the teardown
    waits for work whose result outlives the process (engine.py), and an item being
    loaded dies with it. An idle worker (no task outstanding) leaves by itself
    within WORKER_GRACE; a busy one is SIGTERMed as multiprocessing would at exit (torch's
    worker handler makes a SIGTERM from its parent a quiet exit 0), SIGKILLed after
    WORKER_GRACE, after its pid is taken off torch's SIGCHLD check: no "killed by signal".

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
        it._workers_done_event.set()
        it._workers_done_event = threading.Event()  # from here on this process never takes the shared lock
        it._workers_done_event.set()
        for worker_id, _ in enumerate(it._workers):
            if it._persistent_workers or it._workers_status[worker_id]:
                it._mark_worker_as_unavailable(worker_id, shutdown=True)
        busy = {info[0] for info in getattr(it, "_task_info", {}).values() if len(info) == 1}
        until = time.monotonic() + grace
        for worker_id, w in enumerate(it._workers):
            if worker_id not in busy:
                w.join(max(0.0, until - time.monotonic()))
        left = [w for w in it._workers if w.exitcode is None]
        if left:
            on_sigterm(it)
            for method in ("terminate", "kill"):
                # A SIGKILLed worker dies, if slowly on a loaded machine: wait for it while the
                # budget lasts, so that torch's own joins (5 s each) find it gone.
                until = time.monotonic() + grace if method == "terminate" else max(time.monotonic() + grace, deadline)
                for w in left:
                    getattr(w, method)()
                for w in left:
                    w.join(max(0.0, until - time.monotonic()))
                left = [w for w in left if w.exitcode is None]
            log.debug("ended %d DataLoader worker(s) loading items nobody will read", len(busy))
    except Exception:
        log.debug_exception("early stop of %r failed; torch's shutdown follows", it)
    it._shutdown_workers()  # torch's bookkeeping


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
