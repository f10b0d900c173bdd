"""The exit engine: one place that finalizes every recorded resource, in order,
within a deadline, however the process ends.

Why it runs before torch's, wandb's and Ray's own exit hooks: atexit runs
last-in-first-out, and those libraries register their hooks after we are
imported (torch when torch.utils.data is imported, wandb when its service
starts, Ray at import and in ray.init). So atexit cannot put us first. We use
`threading._register_atexit` instead: CPython calls those functions from
`threading._shutdown()`, which `Py_FinalizeEx` runs before *any* atexit
callback (it is how concurrent.futures stops its workers). They run after an
uncaught exception's traceback is printed (`sys.last_value` is set) and
before non-daemon threads are joined. Where it is missing we fall back to
atexit.

Signals (signals.py): while SIGTERM's handler is the default we install one
that finalizes and then dies of the same signal (same exit status). A handler
the user or a library installed is left alone: it decides, and a normal exit
still comes through here. SIGINT stays Python's KeyboardInterrupt.

Each finalizer runs in a helper thread, so a hung one cannot hang the exit:
it may use the time left but a second for each later step, and is then
abandoned (the thread is a daemon). Errors are logged as one line, never
raised.
"""

import os
import sys
import time
import _thread

from . import config, log, registry

_kinds = []              # (order, kind, finalize_one, after_all, in_child), sorted by order
_lock = _thread.RLock()
_running = False         # a finalize() is under way in this process
_armed_pid = None        # pid in which the exit hook and signal handler were set up
_signal_received = None  # signum, when our signal handler started the exit
_exit_requested = None   # the argument of the last sys.exit() call
_original_sys_exit = None
_terminating = _thread.allocate_lock()  # held by whoever finalizes on SIGTERM


def register_kind(kind, order, finalize_one, after_all=None, in_child=None):
    """Declare how to finalize resources of `kind`.

    finalize_one(obj, timeout): finalize one live object, within `timeout` seconds.
    after_all(timeout): run once after the kind's objects (e.g. wandb.teardown).
    in_child(obj): called in a fork child for each object the parent had, so the
    child never touches it.
    """
    with _lock:
        _kinds[:] = [k for k in _kinds if k[1] != kind]
        _kinds.append((order, kind, finalize_one, after_all, in_child))
        _kinds.sort(key=lambda k: k[0])


def arm():
    """Set up the exit hook, the SIGTERM handler and exit-code tracking (once per process).

    Called by the integrations when they patch, so a process that never imports
    torch, wandb or ray pays nothing for them.
    """
    global _armed_pid
    with _lock:
        if _armed_pid == os.getpid():
            return
        _armed_pid = os.getpid()
    try:
        import threading

        threading._register_atexit(_on_exit)
    except Exception:  # not CPython >= 3.9, or already shutting down
        import atexit

        atexit.register(_on_exit)
        log.debug("threading._register_atexit unavailable; using atexit")
    _track_sys_exit()
    _track_top_level_system_exit()
    from . import signals

    signals.install(_terminate)


_code_override = None    # exit_code= of the finalize() under way


def finalize(timeout=None, kinds=None, exit_code=None):
    """Finalize every live resource now (or only those of `kinds`), in order,
    within `timeout` seconds (default AUTOTEARDOWN_TIMEOUT). Safe to call more
    than once: what was finalized is forgotten. Never raises.

    exit_code: the code the finalizers hand on (wandb's exit record, mlflow's
    status) when the caller knows better than the process (a Ray Train worker
    whose training function raised)."""
    global _running, _code_override
    with _lock:
        if _running:
            return
        _running = True
        _code_override = exit_code
    try:
        _finalize(config.TIMEOUT if timeout is None else timeout, kinds)
    except BaseException:
        log.debug_exception("finalize failed")
    finally:
        _running = False
        _code_override = None


def _finalize(timeout, only):
    started = time.monotonic()
    deadline = started + timeout
    steps = []
    with _lock:
        kinds = list(_kinds)
    for _, kind, finalize_one, after_all, _ in kinds:
        if only is not None and kind not in only:
            continue
        objs = registry.live(kind)
        for obj in objs:
            registry.forget(obj)
            steps.append((f"{kind} {_describe(obj)}", finalize_one, (obj,)))
        if after_all is not None and objs:
            steps.append((f"{kind} (after all)", after_all, ()))
    for index, (label, func, args) in enumerate(steps):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            log.warning("deadline of %gs reached; not finalized: %s",
                        timeout, ", ".join(s[0] for s in steps[index:]))
            break
        # A step may take all the time left but a second for each step after
        # it (never less than its fair share), so one hung step cannot starve the rest.
        left = len(steps) - index
        budget = max(remaining / left, remaining - (left - 1) * 1.0)
        _run_bounded(label, func, args, budget)
    if steps:
        log.debug("finalized %d step(s) in %.3fs", len(steps), time.monotonic() - started)


def _run_bounded(label, func, args, budget):
    """Run func(*args, budget) in a helper thread and wait at most `budget` seconds."""
    outcome = []
    done = _thread.allocate_lock()
    done.acquire()

    def target():
        try:
            func(*args, budget)
            outcome.append(None)
        except BaseException as exc:  # SystemExit too: wandb.teardown can raise it
            outcome.append(exc)
        finally:
            done.release()

    started = time.monotonic()
    try:
        _thread.start_new_thread(target, ())
        done.acquire(timeout=budget)
    except RuntimeError:
        # Some Python 3.12 releases (3.12.1 here) refuse new threads once shutdown has begun: run
        # inline, with faulthandler's C watchdog (exit status 1) as the last resort.
        import faulthandler

        faulthandler.dump_traceback_later(budget + 1, exit=True)
        try:
            target()
        finally:
            faulthandler.cancel_dump_traceback_later()
    elapsed = time.monotonic() - started
    if not outcome:
        log.warning("%s: still running after %.1fs; left behind", label, elapsed)
    elif outcome[0] is not None and not isinstance(outcome[0], SystemExit):
        log.failure(label, outcome[0])
    else:
        log.debug("finalized %s in %.3fs", label, elapsed)


def _describe(obj):
    return f"{type(obj).__name__}@{id(obj):#x}"


def _on_exit():
    if _armed_pid != os.getpid():  # inherited through fork: the parent's business
        return
    _note_multiprocessing_exitcode()
    finalize()


def _note_multiprocessing_exitcode():
    """A multiprocessing child (spawn, forkserver) ends in BaseProcess._bootstrap, which
    catches what run() raised, sets `exitcode`, calls threading._shutdown() (so us), and
    only then returns it to sys.exit(). Nothing else shows that code yet: read it there."""
    global _exit_requested
    bootstrap = getattr(sys.modules.get("multiprocessing.process"), "BaseProcess", None)
    code = getattr(getattr(bootstrap, "_bootstrap", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None and code is not None:
        if frame.f_code is code:
            exitcode = frame.f_locals.get("exitcode")
            if isinstance(exitcode, int):
                _exit_requested = exitcode
            return
        frame = frame.f_back


# ---- how the process is ending ---------------------------------------------

def exit_code():
    """The status the process is about to exit with, as far as Python lets us see it,
    and the uncaught exception if there is one: (code, exception or None)."""
    if _code_override is not None:
        return _code_override, None
    if _signal_received is not None:
        return 128 + _signal_received, None
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is not None:
        return 1, exc
    code = _exit_requested
    if code is None:
        return 0, None
    if isinstance(code, int):
        return code, None
    return 1, None  # sys.exit("message") prints it and exits 1


def exit_signal():
    """The signal number the process is ending from (SIGTERM), or None."""
    return _signal_received


def _track_sys_exit():
    global _original_sys_exit
    if _original_sys_exit is not None:
        return
    _original_sys_exit = sys.exit

    import threading

    def exit(status=None):
        global _exit_requested
        # Only the main thread's call ends the process: a thread that ends itself
        # with sys.exit() (wandb.teardown() does, in our helper thread) does not.
        if threading.current_thread() is threading.main_thread():
            _exit_requested = status
        _original_sys_exit(status)

    exit.__wrapped__ = _original_sys_exit
    exit.__doc__ = _original_sys_exit.__doc__
    sys.exit = exit


def _track_top_level_system_exit():
    """Python 3.12+: a bare `raise SystemExit(n)` leaving the main module calls no
    hook (not sys.exit, not sys.excepthook); sys.monitoring's PY_UNWIND event sees
    it, and costs only when an exception unwinds a frame. Python 3.10 and 3.11
    have no such event: there the exit code reads as 0 (wandb's own hooks too)."""
    monitoring = getattr(sys, "monitoring", None)
    tool = next((i for i in (4, 3) if monitoring and monitoring.get_tool(i) is None), None)
    if tool is None:
        return
    import threading

    def on_unwind(code, offset, exception):
        global _exit_requested
        if (isinstance(exception, SystemExit) and code.co_name == "<module>"
                and code.co_filename == getattr(sys.modules.get("__main__"), "__file__", code.co_filename)
                and threading.current_thread() is threading.main_thread()):
            _exit_requested = exception.code

    monitoring.use_tool_id(tool, "autoteardown")
    monitoring.register_callback(tool, monitoring.events.PY_UNWIND, on_unwind)
    monitoring.set_events(tool, monitoring.events.PY_UNWIND)


def _terminate(signum):
    """SIGTERM arrived (see signals.py): finalize once, before the process dies of it."""
    global _signal_received
    with _lock:
        first = _signal_received is None
        _signal_received = signum
    if first and _armed_pid == os.getpid():
        _terminating.acquire()  # never released: a second caller waits here to be killed
        finalize()
    else:
        _terminating.acquire()


def disarm():
    """Undo arm() as far as possible (the threading exit hook stays, and does nothing)."""
    global _armed_pid, _original_sys_exit
    _armed_pid = None
    if _original_sys_exit is not None and getattr(sys.exit, "__wrapped__", None) is _original_sys_exit:
        sys.exit = _original_sys_exit
    _original_sys_exit = None
    if "autoteardown.signals" in sys.modules:
        sys.modules["autoteardown.signals"].uninstall()


# ---- fork safety -------------------------------------------------------------

def _after_fork_in_child():
    """A forked child starts with no resources and never finalizes its parent's."""
    global _running, _signal_received, _exit_requested, _terminating, _lock
    # Only the forking thread lives on in the child: a lock another thread held at the
    # fork (a DataLoader worker started while another thread records an iterator, or
    # imports) would never be released here, and the child would hang on it.
    _lock = _thread.RLock()
    registry._lock = _thread.RLock()
    if "autoteardown.importhook" in sys.modules:
        sys.modules["autoteardown.importhook"]._lock = _thread.RLock()
    _running = False
    _signal_received = _exit_requested = None
    _terminating = _thread.allocate_lock()
    if "autoteardown.signals" in sys.modules:
        sys.modules["autoteardown.signals"].reset_in_child()
    parents = registry.take_all()
    with _lock:
        in_child = {kind: cb for _, kind, _, _, cb in _kinds if cb is not None}
    for kind, obj in parents:
        callback = in_child.get(kind)
        if callback is not None:
            try:
                callback(obj)
            except Exception:
                log.debug_exception("fork child: %s cleanup failed", kind)
    # multiprocessing believes the parent's children (DataLoader workers) are
    # ours, and its exit function would SIGTERM them. A fresh child has none.
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        process._children.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
