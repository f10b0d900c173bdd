"""SIGTERM, the one helper thread, and the one way to end a process early. The rules:

1. The handler takes no lock and cannot block: it records the signal, wakes the helper
   and may raise. It is installed only over the default, in the main thread; called by
   a handler that replaced it, it returns at once: that one decides.
2. It unwinds the main thread once with `Stop`, SystemExit(128 + signum), so `finally`
   blocks run and locks are released; the exit hook (engine.py) tears down and the
   process dies of the signal, its status without the shim.
3. The unwind is raised where it cannot be lost: at the end of a `critical` section
   (multiprocessing's fd handoff with a DataLoader worker); again after a finalizer
   that swallowed it; never once the exit has begun. A resource's own `__exit__` leaves
   it to the teardown (engine.is_stop).
4. The helper bounds what cannot be unwound: no unwind within WAIT_FOR_MAIN_THREAD (C
   code), or no teardown at half the deadline (swallowed): it tears down and ends the
   process. TIMEOUT + 1 s after the signal the process ends whatever still runs.
5. `end_process` alone ends a process early, after the multiprocessing children it
   started (a ProcessPoolExecutor's workers).
6. One helper thread per process keeps every timer (`alarm`) and runs what a handler
   hands it (`soon`: Ray's chained handler, ray_worker.py); it is joined before its
   pipe is closed. A fork child has the default SIGTERM, no helper and no timers.

Imported by engine.arm(), not at `import autoteardown`: `signal` costs more than the rest.
"""

import collections
import os
import select
import signal
import sys
import threading
import time

from . import config, log

WAIT_FOR_MAIN_THREAD = 1.0
CHILDREN_GRACE = 1.0  # between SIGTERM and SIGKILL of the children end_process ends
_engine = None
_pid = None           # the process whose helper thread runs
_installed = None     # our handler is SIGTERM's (main thread only); None: not decided yet
_pipe = None          # (read_fd, write_fd) waking the helper; also the wakeup fd if that was free
_own_wakeup = False
_helper = None        # the helper thread
_alarms = []          # [when (monotonic), action]; the signal handler never touches it
_soon = collections.deque()  # actions a signal handler handed to the helper (soon())
_lock = threading.Lock()
_main = threading.main_thread().ident
_hold = 0             # critical sections the main thread is in
_pending = False      # an unwind waits for the critical section to end
_raised = False       # our Stop was raised in the main thread


class Stop(SystemExit):
    """The unwind raised by our SIGTERM handler: SystemExit(128 + signum)."""


def install(engine):
    """Route SIGTERM to us if its handler is the default (main thread only; False
    elsewhere: arm() asks again later) and start the helper thread."""
    global _engine, _installed, _own_wakeup
    _engine = engine
    _start_helper()
    if threading.get_ident() != _main:
        return False
    if _installed is None:
        _installed = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        if not _installed:
            log.debug("SIGTERM already has a handler; leaving it alone")
            return True
        try:
            signal.signal(signal.SIGTERM, _handler)
            previous = signal.set_wakeup_fd(_pipe[1], warn_on_full_buffer=False)
            _own_wakeup = previous == -1
            if not _own_wakeup:  # someone else's (asyncio): keep it theirs
                signal.set_wakeup_fd(previous)
        except (ValueError, OSError):  # a subinterpreter
            _installed = False
    return True


def uninstall():
    global _installed
    if _installed and signal.getsignal(signal.SIGTERM) is _handler:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:
            pass
    _installed = None
    _stop_helper(join=True)


def reset_in_child():
    """A fork child: the default SIGTERM, no helper, no timers, none of the parent's pipe."""
    global _installed, _lock, _main, _hold, _pending, _raised
    if signal.getsignal(signal.SIGTERM) is _handler:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _installed, _lock, _main = None, threading.Lock(), threading.get_ident()
    _hold, _pending, _raised = 0, False, False
    _alarms.clear()
    _soon.clear()
    _stop_helper(join=False)


# ---- the handler and the unwind ------------------------------------------------

def _handler(signum, frame):
    global _pending
    if signal.getsignal(signum) is not _handler:
        return  # called by the handler that replaced ours: it decides
    _engine.on_signal(signum)
    _wake()
    if not _raised and not _engine._exiting:
        if _hold:
            _pending = True  # raised when the critical section ends
        else:
            _raise(signum)


def _raise(signum):
    global _raised, _pending
    _raised, _pending = True, False
    raise Stop(128 + signum)


def critical(wrapped, instance, args, kwargs):
    """A wrapt wrapper: the main thread is not unwound inside `wrapped`; a SIGTERM that
    comes meanwhile unwinds it as soon as `wrapped` returns or raises."""
    global _hold
    if threading.get_ident() != _main:
        return wrapped(*args, **kwargs)
    _hold += 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        _hold -= 1
        if _pending and not _hold:
            _raise(_engine.exit_signal() or signal.SIGTERM)


def on_unraisable(wrapped, instance, args, kwargs):
    """A wrapt wrapper of sys.unraisablehook: our Stop, swallowed in a finalizer, is not
    printed; the helper sends SIGTERM again once the main thread has left this hook."""
    unraisable = args[0] if args else kwargs.get("unraisable")
    if isinstance(getattr(unraisable, "exc_value", None), Stop) and _installed:
        soon(_resend_signal)
        return None
    return wrapped(*args, **kwargs)


# ---- ending a process ----------------------------------------------------------

def end_process(signum=None, code=0):
    """End this process now: SIGTERM the multiprocessing children it started (a pool's
    workers, orphaned without the shim), SIGKILL them after CHILDREN_GRACE, then die of
    `signum` as its default action would, or exit with `code`."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    children = [p for p in getattr(sys.modules.get("multiprocessing.process"), "_children", ())
                if getattr(p, "_parent_pid", None) == os.getpid()]
    for method in ("terminate", "kill"):
        until = time.monotonic() + CHILDREN_GRACE
        for process in children:
            try:
                if process.exitcode is None:
                    getattr(process, method)()
            except Exception:
                pass
        for process in children:
            try:
                process.join(max(0.0, until - time.monotonic()))
            except Exception:
                pass
        children = [p for p in children if p.exitcode is None]
    if signum is not None:
        try:
            signal.signal(signum, signal.SIG_DFL)
        except ValueError:  # not the main thread: the signal module refuses, libc does not
            import ctypes

            ctypes.CDLL(None).signal(int(signum), 0)  # 0 is SIG_DFL
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        time.sleep(1)
        code = 128 + signum
    os._exit(code)


# ---- the helper thread ------------------------------------------------------------

def alarm(when, action):
    """Call action() (which must not block) in the helper thread at monotonic time `when`;
    a token for cancel()."""
    token = [when, action]
    with _lock:
        _alarms.append(token)
    _start_helper()
    _wake()
    return token


def soon(action):
    """From a signal handler (no lock, no blocking): call action() in the helper thread
    at once. False where this process has no helper."""
    if _pipe is None or _pid != os.getpid():
        return False
    _soon.append(action)
    _wake()
    return True


def cancel(token):
    with _lock:
        if token in _alarms:
            _alarms.remove(token)


def _start_helper():
    global _pid, _pipe, _helper
    with _lock:
        if _pid == os.getpid():
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        _pid, _pipe = os.getpid(), (read_fd, write_fd)
        _helper = threading.Thread(target=_serve, args=(read_fd,), name="autoteardown-helper", daemon=True)
        _helper.start()


def _stop_helper(join):
    global _pid, _pipe, _helper, _own_wakeup
    pipe, helper = _pipe, _helper
    _pid = _pipe = _helper = None
    if _own_wakeup:
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass
    _own_wakeup = False
    if pipe is None:
        return
    if join and helper is not None and helper is not threading.current_thread():
        os.write(pipe[1], b"\0")  # it sees _pipe is no longer its own and returns
        helper.join(1.0)
    for fd in pipe:
        try:
            os.close(fd)
        except OSError:
            pass


def _wake():
    pipe = _pipe
    if pipe is not None:
        try:
            os.write(pipe[1], b"\0")
        except OSError:
            pass


def _serve(read_fd):
    watched = False  # the SIGTERM under way has its deadlines
    while True:
        now = time.monotonic()
        with _lock:
            due = [a for a in _alarms if a[0] <= now]
            for a in due:
                _alarms.remove(a)
            waits = [a[0] - now for a in _alarms]
        due += [(None, _soon.popleft()) for _ in range(len(_soon))]
        for _, action in due:
            try:
                action()
            except Exception:
                log.debug_exception("alarm failed")
        try:
            ready, _, _ = select.select([read_fd], [], [], max(0.0, min(waits)) if waits else None)
            data = os.read(read_fd, 512) if ready else b""
        except (OSError, ValueError):
            return
        if _pipe is None or _pipe[0] != read_fd or _pid != os.getpid():
            return  # stopped (uninstall), or a fork child's copy of the parent's fd
        # The wakeup fd carries every Python-handled signal's number; ours, a zero byte.
        if not watched and (_engine is not None and _engine.exit_signal() is not None or (
                signal.SIGTERM in data and _own_wakeup and signal.getsignal(signal.SIGTERM) is _handler)):
            watched = True  # the deadlines of rule 4, counted from when the signal came
            signum, at = _engine._signal or (signal.SIGTERM, now)
            alarm(at + WAIT_FOR_MAIN_THREAD, lambda: _raised or _engine.take_over(signum, at, "no unwind"))
            alarm(at + config.TIMEOUT / 2, lambda: _engine.take_over(signum, at, "not torn down at half the deadline"))
            alarm(at + config.TIMEOUT + 1.0, lambda: end_process(signum))


def _resend_signal():
    """Send the swallowed SIGTERM again once the main thread has left the unraisable
    hook (the handler would raise into it): polled every millisecond."""
    global _raised
    if main_thread_in(on_unraisable.__code__):
        return alarm(time.monotonic() + 0.001, _resend_signal)
    _raised = False
    os.kill(os.getpid(), signal.SIGTERM)


def main_thread_in(code):
    """Is the main thread running this code object now (somewhere in its stack)?"""
    frame = sys._current_frames().get(_main)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None
