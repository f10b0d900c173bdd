"""DataLoader worker iterators: shut their workers down before torch's exit hook.

torch's own atexit hook sets `_utils.python_exit_status`, after which
`_shutdown_workers()` does nothing; multiprocessing's exit function then
SIGTERMs the still-running workers, and a library that kills child processes
later in the exit (Ray does) makes torch's SIGCHLD handler print "DataLoader
worker (pid N) is killed by signal". So we shut the workers down first.

We wrap `_get_iterator` on DataLoader and on torchdata's StatefulDataLoader:
`__iter__` makes every iterator through it, and so does torchdata's
`state_dict()`. torchdata's multi-process iterator is a copy of torch's, not a
subclass, so iterators are recognised by their `_workers` attribute.
"""

import sys
import time

from .. import engine, log, registry
from . import Patches, check_version, installed_version

KIND = "dataloader"
ORDER = 10
TARGETS = (
    ("torch.utils.data.dataloader", "DataLoader"),
    ("torchdata.stateful_dataloader.stateful_dataloader", "StatefulDataLoader"),
)
SUPPORTED = "torch >= 2.0, torchdata >= 0.8"
_patches = Patches()


def get_version():
    return installed_version("torch")


def unsupported_reason():
    return check_version("torch", "2.0") or check_version("torchdata", "0.8")


def patch():
    reason = unsupported_reason()
    if reason:
        log.warning_once("%s; DataLoader workers are left alone", reason, tree=True)
        return
    engine.register_kind(KIND, ORDER, shutdown_workers, in_child=forget_in_child, on_sigterm=unwatch_workers)
    for module_name, class_name in TARGETS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is None:
            continue
        if "_get_iterator" not in vars(cls):
            log.warning_once("%s has no _get_iterator (unsupported version; need %s): not patched",
                             class_name, SUPPORTED, tree=True)
            continue
        _patches.wrap(cls, "_get_iterator", _record_iterator)
    if _patches:
        engine.arm()


def unpatch():
    _patches.restore()


def _record_iterator(wrapped, instance, args, kwargs):
    it = wrapped(*args, **kwargs)
    try:
        if getattr(it, "_workers", None):
            registry.record(KIND, it)
    except Exception:
        log.debug_exception("could not record %r", it)
    return it


def forget_in_child(it):
    # In a fork child the iterator's events and queues are shared with the
    # parent: shutting it down (even from __del__) would stop the parent's
    # workers and hang its next(). Mark it done so the child never does.
    it._shutdown = True
    it._worker_pids_set = False
    # multiprocessing believes the parent's workers are ours, and its exit function
    # would SIGTERM them.
    children = getattr(sys.modules.get("multiprocessing.process"), "_children", None)
    for worker in getattr(it, "_workers", ()):
        if children is not None:
            children.discard(worker)


def unwatch_workers(it):
    # The process is ending of SIGTERM: workers dying now are no error to report (without
    # us the process would be gone already). torch's _shutdown_workers() does this first.
    if getattr(it, "_worker_pids_set", False):
        it._worker_pids_set = False  # first: a second call must not remove them twice (torch raises)
        sys.modules["torch.utils.data._utils.signal_handling"]._remove_worker_pids(id(it))


def shutdown_workers(it, timeout):
    """Signal every worker first, then wait once, then let torch do its bookkeeping.

    torch's `_shutdown_workers()` joins workers one after another with a 5 s
    timeout each, so N stuck workers cost N x 5 s; torchdata with persistent
    workers and pin_memory also registers a per-worker atexit that waits 5 s
    each. Stopping them all here first makes both fast.
    """
    if getattr(it, "_shutdown", True):
        return
    try:
        _stop_all(it, min(timeout * 0.8, 5.0))
    except Exception:
        log.debug_exception("early stop of %r failed; torch's shutdown follows", it)
    # Marks the iterator shut down, closes the queues, removes the worker pids
    # from torch's SIGCHLD handler and terminates any worker still alive.
    it._shutdown_workers()


def _stop_all(it, timeout):
    deadline = time.monotonic() + timeout
    # As torch does: the pin-memory thread first, since workers exiting can leave
    # half-written data in the queue it reads.
    thread = getattr(it, "_pin_memory_thread", None)
    if thread is not None:
        it._pin_memory_thread_done_event.set()
        it._worker_result_queue.put((None, None))
        thread.join(max(0.0, deadline - time.monotonic()))
    it._workers_done_event.set()
    for worker_id, _ in enumerate(it._workers):
        if it._persistent_workers or it._workers_status[worker_id]:
            it._mark_worker_as_unavailable(worker_id, shutdown=True)
    # Every worker has been told to stop: these joins share one deadline.
    for w in it._workers:
        w.join(max(0.0, deadline - time.monotonic()))
    stuck = [w for w in it._workers if w.exitcode is None]
    for w in stuck:
        w.terminate()
    for w in stuck:
        w.join(1.0)
    if stuck:
        log.debug("terminated %d stuck DataLoader worker(s)", len(stuck))
