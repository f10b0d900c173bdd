"""The exit engine: one teardown that finalizes every recorded resource, in order,
within a deadline, however the process ends, and never changes how it ends.

It runs from threading's exit callbacks, which CPython calls before any atexit
callback (torch, wandb and Ray register theirs after us). A normal end tears down
after the non-daemon threads; after a SIGTERM, at once, then the process dies of
the signal (signals.py). Armed at the first resource recorded (registry.py).

Each step runs in a runner thread and may use the time left but a second per later
step; another runner drives the steps, so the calling thread only waits, the one
place that can ignore what a signal handler raises (torch's SIGCHLD one). Runners
start when armed (Python 3.12.0-3.12.2 refuse new threads at exit); without one, a
step runs inline under an alarm. Errors are one warning, never raised.
"""

import os
import sys
import time
import _thread

from . import config, log, registry
from .integrations import Patches

_kinds = []             # (order, kind, finalize_one, after_all, in_child, on_sigterm), by order
_lock = _thread.RLock()
_busy = _thread.allocate_lock()  # held by the teardown under way
_finalizer = None       # ident of the thread that asked for it
_code_override = None   # exit_code= of the finalize() under way
_armed_pid = None
_signals_ready = False  # signals.install() ran in the main thread of this process
_exiting = False        # threading's exit callbacks have begun
_exit_done = False      # the exit teardown has run
_signal = None          # (signum, monotonic time) of the SIGTERM taken
_exit_status = None     # (code, frames) of the SystemExit leaving __main__ (_track_exit)
_mp_exitcode = None     # a multiprocessing child's exit code
_idle = []              # queues of idle runner threads
_stepping = set()       # idents of the threads running a step now
_hooked = False         # the exit hooks are registered
_monitoring_tool = None
_patches = Patches()
_when_armed = []        # quick hooks called when a process is armed (ray_worker's announce)


def register_kind(kind, order, finalize_one, after_all=None, in_child=None, on_sigterm=None):
    """Declare how to finalize resources of `kind`: finalize_one(obj, timeout) (a string
    it returns is the report's outcome), after_all(timeout) once after them, in_child(obj)
    in a fork child for each object the parent had, on_sigterm(obj) in the SIGTERM
    handler (no lock, no blocking)."""
    with _lock:
        _kinds[:] = sorted([k for k in _kinds if k[1] != kind] + [
            (order, kind, finalize_one, after_all, in_child, on_sigterm)], key=lambda k: k[0])


def when_armed(hook):
    """Call hook() (quick, never raising) whenever a process is armed: it has something to tear down."""
    if hook not in _when_armed:
        _when_armed.append(hook)


def arm():
    """Exit hooks, runners, exit-code tracking and SIGTERM, once per process (SIGTERM from
    the main thread only: else again at the next record)."""
    global _armed_pid, _signals_ready, _hooked
    with _lock:
        if _armed_pid != os.getpid():
            _armed_pid = os.getpid()
            if not _hooked:  # a fork child inherits them
                _hooked = True
                import threading

                # First in the list is called last, after concurrent.futures' callbacks.
                late = getattr(threading, "_threading_atexits", None)
                if isinstance(late, list) and not getattr(threading, "_SHUTTING_DOWN", False):
                    threading._register_atexit(_on_exit)
                    late.insert(0, _on_exit_after_threads)
                else:  # not CPython >= 3.9, or already shutting down
                    import atexit

                    atexit.register(_on_exit_after_threads)
            _track_exit()
            _start_runner()  # two: one drives the steps, one runs them
            _start_runner()
            util = sys.modules.get("multiprocessing.util")
            if util is not None:
                _patches.wrap(util, "_exit_function", _before_multiprocessing_exit)
            _report("header")
            for hook in _when_armed:
                hook()
        if not _signals_ready:
            from . import signals

            _signals_ready = signals.install(sys.modules[__name__])
            if _signals_ready:
                _patches.wrap(sys, "unraisablehook", signals.on_unraisable)
        registry.on_record = None if _signals_ready else arm


def finalize(timeout=None, kinds=None, exit_code=None):
    """Finalize every live resource now (or those of `kinds`) within `timeout` seconds,
    handing on `exit_code` if given. A KeyboardInterrupt or SystemExit while waiting
    stops the teardown (the rest stays recorded) and is raised again."""
    interrupted = _finalize(time.monotonic() + (config.TIMEOUT if timeout is None else timeout), kinds, exit_code)
    if interrupted is not None:
        raise interrupted


def _finalize(deadline, only=None, exit_code=None, why=None):
    """One teardown, never raising; returns what interrupted the waiting thread, if anything."""
    global _finalizer, _code_override
    if _finalizer == _thread.get_ident() or _thread.get_ident() in _stepping:
        return None  # a step called finalize() (ray.shutdown() in a finalizer)
    if not _busy.acquire(timeout=max(0.0, deadline - time.monotonic())):
        log.warning("another teardown is still running; not finalized")
        return None
    _finalizer, _code_override, stop = _thread.get_ident(), exit_code, []
    outcome, interrupted = _in_runner(_run_steps, (deadline, only, stop, why), deadline + 1.0, "the teardown")
    if outcome and isinstance(outcome[0], BaseException):
        log.debug_exception("finalize failed", exc_info=outcome[0])
    if interrupted is not None:
        stop.append(interrupted)  # the steps stop before the next one; the rest stay recorded
        log.warning("teardown interrupted (%s)", type(interrupted).__name__)
    return interrupted


def _run_steps(deadline, only, stop, why):
    """The teardown's steps, in a runner; it ends the teardown (`_busy`) when they are done."""
    global _finalizer, _code_override
    started, steps = time.monotonic(), []
    for _, kind, finalize_one, after_all, _, _ in list(_kinds):  # a copy is atomic, as on_signal's
        objs = registry.live(kind) if only is None or kind in only else ()
        steps += [(kind, obj, finalize_one) for obj in objs] + [(kind, None, after_all)] * bool(after_all and objs)
    try:
        if steps or only is None:  # a partial finalize() with nothing to do: the exit reports
            code, _, trigger = ending()
            _report("begin", why or trigger, code)
        for index, (kind, obj, func) in enumerate(steps):
            remaining, left = deadline - time.monotonic(), len(steps) - index
            if stop:
                break
            if remaining <= 0:
                log.warning("deadline reached; not finalized: %s", ", ".join(_name(k, o) for k, o, _ in steps[index:]))
                break
            if obj is not None:
                registry.forget(obj)  # just before its step: an interrupted teardown leaves the rest
            # All the time left but a second for each later step (at least its fair share).
            _run_bounded(kind, obj, func, max(remaining / left, remaining - (left - 1) * 1.0))
        if steps or only is None:
            _report("end", time.monotonic() - started, bool(stop))
    finally:
        _finalizer = _code_override = None
        _busy.release()


def _wait(done, until, what):
    """Wait for the lock `done` until `until`, in slices (Python signal handlers run only
    between bytecodes): the KeyboardInterrupt or SystemExit that stopped the wait, else
    None. Another exception is a signal handler's (torch's SIGCHLD one): keep waiting."""
    while True:
        try:
            if done.acquire(timeout=min(0.05, max(0.0, until - time.monotonic()))) or time.monotonic() >= until:
                return None
        except (KeyboardInterrupt, SystemExit) as interrupted:
            return interrupted
        except Exception as exc:
            log.debug("while waiting for %s: %s: %s", what, type(exc).__name__, exc)


def _in_runner(func, args, until, what):
    """func(*args) in a runner thread, waited for until `until`: ([its result or exception],
    or [] while it runs on; what stopped the wait). With no thread to be had it runs
    inline, and should it hang, the process ends with its status a second after `until`."""
    outcome, done = [], _thread.allocate_lock()
    done.acquire()

    def run():
        _stepping.add(_thread.get_ident())
        try:
            outcome.append(func(*args))
        except BaseException as exc:  # SystemExit too: wandb.teardown() can raise it
            outcome.append(exc)
        finally:
            _stepping.discard(_thread.get_ident())
            done.release()

    if _submit(run):
        return outcome, _wait(done, until, what)
    from . import signals

    guard = signals.alarm(until + 1.0, lambda: signals.end_process(code=ending()[0]))
    try:
        run()
    finally:
        signals.cancel(guard)
    return outcome, None


def _run_bounded(kind, obj, func, budget):
    """Run one step in a runner thread and wait at most `budget` seconds for it."""
    started = time.monotonic()
    outcome, _ = _in_runner(func, (budget,) if obj is None else (obj, budget), started + budget, kind)
    elapsed, name = time.monotonic() - started, _name(kind, obj)
    result = outcome[0] if outcome else "left behind"
    if not outcome:
        log.warning("%s: still running after %.1fs; left behind", name, elapsed)
    elif isinstance(result, BaseException) and not isinstance(result, SystemExit):
        log.warning("%s: %s: %s", name, type(result).__name__, result)
        log.debug_exception("%s failed", name, exc_info=result)
        result = f"failed: {type(result).__name__}: {result}"
    _report("step", kind, obj, result if isinstance(result, str) else "finalized", elapsed)


def _submit(work):
    """Hand `work` to an idle runner, keeping one spare; False if no thread can be had."""
    with _lock:
        jobs = _idle.pop() if _idle else _start_runner(idle=False)
    if jobs is None:
        return False
    jobs.put(work)
    if not _idle:
        _start_runner()
    return True


def run_soon(work):
    """Run `work` in a runner thread, or inline if none can be had (an alarm's blocking part)."""
    if not _submit(work):
        work()


def _start_runner(idle=True):
    import queue
    import threading

    jobs = queue.SimpleQueue()

    def serve():
        while True:
            jobs.get()()
            with _lock:
                _idle.append(jobs)

    try:
        threading.Thread(target=serve, name="autoteardown-step", daemon=True).start()
    except RuntimeError:  # can't create new thread at interpreter shutdown
        return None
    if idle:
        with _lock:
            _idle.append(jobs)
    return jobs


def _name(kind, obj):
    name = _report("describe", kind, obj)
    return f"{kind} {name or ('(after all its resources)' if obj is None else type(obj).__name__)}"


def _report(event, *args):
    """report.py's `event`, imported only when a report is asked for; never raises."""
    try:
        if config.DEBUG or config.REPORT:
            from . import report

            return getattr(report, event)(*args)
    except Exception:
        log.debug_exception("teardown report: %s failed", event)
    return None


# ---- the exit hooks ---------------------------------------------------------------

def _on_exit():
    """Called first among threading's exit callbacks: after a SIGTERM, tear down now."""
    global _exiting
    if _armed_pid != os.getpid():
        return  # inherited through fork: the parent's business
    _exiting = True
    if _signal is not None and not _exit_done:
        _exit_teardown()


def _on_exit_after_threads():
    """Called last: on a normal end, once the non-daemon threads have ended (waited for as
    Python does right after; a SIGTERM stops the wait)."""
    global _exiting
    if _armed_pid != os.getpid() or _exit_done:
        return
    _exiting = True
    import threading

    try:
        while _signal is None:
            alive = [t for t in threading.enumerate() if not t.daemon and t.is_alive()
                     and t is not threading.current_thread() and t is not threading.main_thread()]
            if not alive:
                break
            alive[0].join(0.05)
    finally:  # a Ctrl-C that stops the wait is Python's to report, after the teardown
        _exit_teardown()


def _before_multiprocessing_exit(wrapped, instance, args, kwargs):
    """BaseProcess._bootstrap calls `util._exit_function()`, which SIGTERMs the daemonic
    children (DataLoader workers), before threading's exit callbacks: a multiprocessing
    child tears down here first, with the code run()'s outcome gives it."""
    global _mp_exitcode
    bootstrap = getattr(sys.modules.get("multiprocessing.process"), "BaseProcess", None)
    frame, code = sys._getframe(1), getattr(getattr(bootstrap, "_bootstrap", None), "__code__", None)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    if frame is not None and _armed_pid == os.getpid() and not _exit_done:
        exc = sys.exc_info()[1]
        _mp_exitcode = 0 if exc is None else _code_of(exc.code) if isinstance(exc, SystemExit) else 1
        _on_exit_after_threads()
    return wrapped(*args, **kwargs)


def _exit_teardown():
    global _exit_done
    _exit_done = True
    signal_ = _signal
    interrupted = _finalize((signal_[1] if signal_ else time.monotonic()) + config.TIMEOUT)
    if interrupted is not None:
        log.debug("exit teardown cut short by %r", interrupted)
    if _signal is not None:  # a SIGTERM before or during the teardown: die of it, as without us
        sys.modules["autoteardown.signals"].end_process(_signal[0])


# ---- signals (called by signals.py) -----------------------------------------------

def on_signal(signum, ours=True):
    """In a SIGTERM handler (no lock, no logging): record the first signal, unless another
    handler decides how the process ends (Ray's), and run the kinds' on_sigterm (the
    DataLoader workers die with the process group)."""
    global _signal
    if _signal is None and ours:
        _signal = (signum, time.monotonic())
    for _, kind, _, _, _, on_sigterm in list(_kinds):
        for obj in registry.live(kind) if on_sigterm else ():
            try:
                on_sigterm(obj)
            except Exception:
                pass


def is_stop(exc):
    """Is `exc` our SIGTERM unwind? A resource's own `__exit__` leaves it to the teardown."""
    stop = getattr(sys.modules.get("autoteardown.signals"), "Stop", None)
    return stop is not None and isinstance(exc, stop)


def take_over(signum, at, why):
    """signals.py's rule 4: unless a teardown is under way, tear down and die of the signal."""
    if _busy.locked():
        return
    if _signal is None:
        on_signal(signum)
    log.debug("SIGTERM: %s after %.1fs; tearing down from a helper thread", why, time.monotonic() - at)
    signals = sys.modules["autoteardown.signals"]

    def work():
        _finalize(at + config.TIMEOUT, why="SIGTERM")
        signals.end_process(signum)

    run_soon(work)


def exit_signal():
    """The signal number the process is ending from (SIGTERM), or None."""
    return _signal[0] if _signal else None


# ---- how the process is ending -------------------------------------------------------

def ending():
    """(code, uncaught exception or None, trigger). The first that applies:

    1. finalize(exit_code=n): the caller knows (a Ray Train worker's function raised).
    2. A SIGTERM we took: 128 + signum (the process then dies of it).
    3. The uncaught exception that ended __main__ (KeyboardInterrupt too): 1. Trusted
       only outside interactive sessions and when its traceback starts in __main__'s
       own frame (a REPL or code.interact() leave stale ones behind).
    4. A multiprocessing child's exit code (see _before_multiprocessing_exit).
    5. The SystemExit that left __main__: its code (None 0, a message 1).
    6. 0: __main__ ran to its end, or Python hides how it ended (see _track_exit).
    """
    if _code_override is not None:
        return _code_override, None, f"finalize(exit_code={_code_override})"
    if _signal is not None:
        return 128 + _signal[0], None, "SIGTERM"
    exc = _uncaught()
    if exc is not None:
        return 1, exc, type(exc).__name__ if isinstance(exc, KeyboardInterrupt) else "exception"
    if _mp_exitcode is not None:
        return _mp_exitcode, None, "multiprocessing exit"
    # Before 3.12 (_on_sys_exit) the sys.exit() call counts only if every frame from its
    # caller up to __main__'s stopped where it was then: the SystemExit was not caught.
    if _exit_status is not None and all(frame.f_lasti == lasti for frame, lasti in _exit_status[1]):
        return _code_of(_exit_status[0]), None, f"sys.exit({_exit_status[0]!r})"
    return 0, None, "normal end" if _exiting else "finalize()"


def _code_of(status):
    """The exit status of SystemExit(status): None 0, a message 1."""
    return 0 if status is None else status if isinstance(status, int) else 1


def _uncaught():
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None or hasattr(sys, "ps1") or sys.flags.interactive:
        return None
    main = getattr(sys.modules.get("__main__"), "__dict__", None)
    tb = getattr(exc, "__traceback__", None)
    while tb is not None and tb.tb_frame.f_globals.get("__name__") == "runpy":  # python -m
        tb = tb.tb_next
    if tb is None or tb.tb_frame.f_globals is not main or tb.tb_frame.f_code.co_name != "<module>":
        return None
    return exc


def _track_exit():
    """See the SystemExit that leaves __main__: on 3.12+ sys.monitoring's PY_UNWIND (a bare
    `raise SystemExit(n)` too); before (or with no free tool id) sys.exit() is wrapped."""
    global _monitoring_tool
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None and _monitoring_tool is None:
        for tool in (4, 3):
            try:
                monitoring.use_tool_id(tool, "autoteardown")
            except ValueError:  # taken (a debugger, coverage, a profiler)
                continue
            monitoring.register_callback(tool, monitoring.events.PY_UNWIND, _on_unwind)
            monitoring.set_events(tool, monitoring.events.PY_UNWIND)
            _monitoring_tool = tool
            return
    if _monitoring_tool is None:
        _patches.wrap(sys, "exit", _on_sys_exit)


def _on_sys_exit(wrapped, instance, args, kwargs):
    global _exit_status
    # Only the main thread's call ends the process (wandb.teardown() calls it in a runner).
    if _thread.get_ident() == _main_ident():
        main, frames, frame = getattr(sys.modules.get("__main__"), "__dict__", None), [], sys._getframe(1)
        while frame is not None:
            frames.append((frame, frame.f_lasti))
            if frame.f_code.co_name == "<module>" and frame.f_globals is main:
                _exit_status = (args[0] if args else kwargs.get("status"), frames)
                break
            frame = frame.f_back
    return wrapped(*args, **kwargs)


def _on_unwind(code, offset, exception):
    global _exit_status
    if (isinstance(exception, SystemExit) and code.co_name == "<module>"
            and sys._getframe(1).f_globals is getattr(sys.modules.get("__main__"), "__dict__", None)
            and _thread.get_ident() == _main_ident()):
        _exit_status = (exception.code, ())


def _main_ident():
    import threading

    return threading.main_thread().ident


def disarm():
    """Undo arm() as far as possible (the threading exit hooks stay, and do nothing)."""
    global _armed_pid, _signals_ready, _monitoring_tool
    _armed_pid, _signals_ready = None, False
    registry.on_record = None  # install() sets it again
    _patches.restore()
    if _monitoring_tool is not None:
        monitoring = sys.monitoring
        monitoring.set_events(_monitoring_tool, 0)
        monitoring.register_callback(_monitoring_tool, monitoring.events.PY_UNWIND, None)
        monitoring.free_tool_id(_monitoring_tool)
        _monitoring_tool = None
    if "autoteardown.signals" in sys.modules:
        sys.modules["autoteardown.signals"].uninstall()


# ---- fork safety -----------------------------------------------------------------------

def _after_fork_in_child():
    """A fork child starts with no resources and the default SIGTERM until it records one."""
    global _lock, _busy, _finalizer, _signals_ready, _exiting, _exit_done, _signal, _exit_status
    # Another thread's lock would never be released here (registry and importhook reset theirs).
    _lock, _busy = _thread.RLock(), _thread.allocate_lock()
    _finalizer, _signals_ready, _exiting, _exit_done, _signal, _exit_status = None, False, False, False, None, None
    _idle.clear()
    _stepping.clear()
    if _armed_pid is not None or registry.on_record is not None:  # installed: arm at the child's first record
        registry.on_record = arm
    if "autoteardown.signals" in sys.modules:
        sys.modules["autoteardown.signals"].reset_in_child()
    in_child = {kind: cb for _, kind, _, _, cb, _ in _kinds if cb is not None}
    for kind, obj in registry.take_all():
        callback = in_child.get(kind)
        if callback is not None:
            try:
                callback(obj)
            except Exception:
                log.debug_exception("fork child: %s cleanup failed", kind)


os.register_at_fork(after_in_child=_after_fork_in_child)
