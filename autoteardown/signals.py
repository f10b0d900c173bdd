"""SIGTERM: its state, the handler, the unwind, and the one way to end a process early.

1. The handler takes no lock and cannot block: it records the signal, wakes the helper
   thread (threads.py) and may raise. It is installed only over the default, in the main
   thread; called by a handler that replaced it, it returns at once: that one decides. A
   handler that runs nested in it (torch's SIGCHLD, as the workers die of the same group
   SIGTERM) cannot stop it: what that raises is dropped.
2. It unwinds the main thread once with `Stop`, SystemExit(128 + signum), so `finally`
   blocks run and locks are released; the exit hook (engine.py) tears down and the
   process dies of the signal, its status without the shim.
3. The unwind is raised where it cannot be lost: at the end of a `critical` section
   (multiprocessing's fd handoff with a DataLoader worker); again after a finalizer
   that swallowed it; never once the exit has begun. A resource's own `__exit__` leaves
   it to the teardown (`is_stop`). A handler we chain (Ray's, `chain`) raises an unwind of
   its own: swallowed in a finalizer, it is raised again too.
4. The helper bounds what cannot be unwound: no unwind within WAIT_FOR_MAIN_THREAD (C
   code), or no teardown at half the deadline (swallowed): the engine takes over (its
   `take_over` callback) and ends the process. A second past the deadline the process
   ends whatever still runs. Every one of these times is deadlines.py's.
5. `end_process` alone ends a process early, after the multiprocessing children it
   started (a ProcessPoolExecutor's workers).

The engine hands in its callbacks (`install`); this module imports no part of it.
Imported when a process is armed, not at `import autoteardown`: `signal` costs more
than the rest.
"""

import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from . import cpython, deadlines, forksafe, processes, threads
from .patches import Patches

CHILDREN_GRACE = 1.0  # the grace of the children end_process ends
_patches = Patches()  # sys.unraisablehook's wrapper (on_unraisable); uninstall() puts it back


class Stop(SystemExit):
    """The unwind raised by our SIGTERM handler: SystemExit(128 + signum)."""


class _State:
    """This process's SIGTERM state; a fork child starts with a new one."""

    def __init__(self) -> None:
        self.received: tuple[int, float] | None = None  # (signum, monotonic time) of the first SIGTERM taken
        self.exiting = False    # threading's exit callbacks have begun (engine.py)
        self.installed: bool | None = None  # our handler is SIGTERM's (main thread only); None: not decided
        self.own_wakeup = False  # the helper's pipe is the signal wakeup fd
        self.main = threading.main_thread().ident
        self.hold = 0           # critical sections the main thread is in
        self.pending = False    # an unwind waits for the critical section to end
        self.raised = False     # our Stop was raised in the main thread
        self.watched = False    # the deadlines of rule 4 are set
        self.on_sigterm: Callable[[int], None] | None = None  # the engine's: what to do at once (no lock)
        self.take_over: Callable[[int, float, str], None] | None = None  # the engine's rule 4
        self.spared: set[int] = set()  # pids of the children end_process leaves running


_state = _State()


def install(on_sigterm: Callable[[int], None], take_over: Callable[[int, float, str], None]) -> bool:
    """Route SIGTERM to us if its handler is the default (main thread only; False
    elsewhere: the engine asks again later) and start the helper thread."""
    _state.on_sigterm, _state.take_over = on_sigterm, take_over
    threads.start_helper(on_wakeup=_on_wakeup)
    if threading.get_ident() != _state.main:
        return False
    _patches.wrap(sys, "unraisablehook", on_unraisable)
    if _state.installed is None:
        _state.installed = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        if not _state.installed:
            from . import log

            log.debug("SIGTERM already has a handler; leaving it alone")
            return True
        try:
            signal.signal(signal.SIGTERM, _handler)
            previous = signal.set_wakeup_fd(threads.wakeup_fd(), warn_on_full_buffer=False)
            _state.own_wakeup = previous == -1
            if not _state.own_wakeup:  # someone else's (asyncio): keep it theirs
                signal.set_wakeup_fd(previous)
        except (ValueError, OSError):  # a subinterpreter
            _state.installed = False
    return True


def uninstall() -> None:
    _patches.restore()
    if _state.installed and signal.getsignal(signal.SIGTERM) is _handler:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:
            pass
    _drop_wakeup_fd()
    _state.installed, _state.watched = None, False
    threads.stop_helper(join=True)


def received() -> tuple[int, float] | None:
    """(signum, monotonic time) of the SIGTERM this process is ending from, or None."""
    return _state.received


def record(signum: int, at: float | None = None) -> None:
    """Take `signum` as the signal the process ends from, unless one was taken already."""
    if _state.received is None:
        _state.received = (signum, time.monotonic() if at is None else at)


def begin_exit() -> None:
    """The interpreter's exit has begun: no unwind is raised from now on."""
    _state.exiting = True


def exiting() -> bool:
    return _state.exiting


def is_stop(exc: object) -> bool:
    """Is `exc` our SIGTERM unwind? A resource's own `__exit__` leaves it to the teardown."""
    return isinstance(exc, Stop)


def _drop_wakeup_fd() -> None:
    if _state.own_wakeup:
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass
    _state.own_wakeup = False


def _after_fork_in_child() -> None:
    """A fork child: the default SIGTERM, none of the parent's pipe (threads.py stops its helper)."""
    global _state
    if signal.getsignal(signal.SIGTERM) is _handler:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _drop_wakeup_fd()
    _state = _State()
    _state.main = threading.get_ident()


forksafe.register(__name__, _after_fork_in_child)


# ---- the handler and the unwind ------------------------------------------------

def _handler(signum: int, frame: object) -> None:
    # Each bytecode here is a point where a signal that comes meanwhile runs its handler nested in
    # this one: a group SIGTERM kills the DataLoader workers too, and torch's SIGCHLD handler would
    # report them. So the check is one C call, and on_sigterm (which takes them off its watch) first.
    # What a nested handler raises before that is dropped (the SIGTERM ends the process, not it) and
    # on_sigterm, cut short by it, runs again.
    if cpython.handler_of(signum) is not _handler:
        return  # called by the handler that replaced ours: it decides
    for _ in range(2 if _state.on_sigterm is not None else 0):
        try:
            _state.on_sigterm(signum)  # type: ignore[misc]
            break
        except Exception:
            pass
    record(signum)
    threads.wake()
    if not _state.raised and not _state.exiting:
        if _state.hold:
            _state.pending = True  # raised when the critical section ends
        else:
            _raise(signum)


def chain(handler: Callable) -> Callable:
    """A SIGTERM handler we chain (Ray's), as ours calls it. Its unwind, a SystemExit, is its own,
    and rule 3 holds for it as for ours: swallowed in a finalizer (a `__del__`, a weakref callback
    the signal landed in), it is not printed and the signal is sent again once the main thread has
    left the finalizer (on_unraisable). Without that the process runs on as if never signalled."""
    _patches.wrap(sys, "unraisablehook", on_unraisable)
    return functools.partial(_chained, handler)


def _chained(handler: Callable, signum: int, frame: object) -> object:
    # No `except` here: a frame that handles the SystemExit moves on from where it was when
    # sys.exit() was called, and exitstatus would no longer count the call (a driver's).
    return handler(signum, frame)


def _raised_by_a_chained_handler(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code is not _chained.__code__:
        tb = tb.tb_next
    return tb is not None


def unwound_by_another(signum: int) -> None:
    """In a handler we chain (Ray's, in a driver), before it raises its own unwind for this
    SIGTERM, whose exit path (Ray's shutdown) is its own. Rule 4 still holds for it: if the exit
    has not begun at half the deadline, the engine tears down and the process dies of it."""
    at = time.monotonic()

    def watch() -> None:
        if _state.take_over is not None:
            take_over = _state.take_over
            threads.alarm(deadlines.take_over_at(at),
                          lambda: _state.exiting or take_over(signum, at, "its unwind was lost"))

    threads.soon(watch)


def _raise(signum: int) -> None:
    _state.raised, _state.pending = True, False
    raise Stop(128 + signum)


def critical(wrapped, instance, args, kwargs):
    """A wrapt wrapper: the main thread is not unwound inside `wrapped`; a SIGTERM that
    comes meanwhile unwinds it as soon as `wrapped` returns or raises."""
    if threading.get_ident() != _state.main:
        return wrapped(*args, **kwargs)
    _state.hold += 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        _state.hold -= 1
        if _state.pending and not _state.hold:
            _raise((_state.received or (signal.SIGTERM,))[0])


def exit_unless_stopped(wrapped, instance, args, kwargs):
    """A wrapt wrapper of a run's `__exit__`: in our unwind the teardown ends the run, with the
    signal's status (rule 3), not the run's own `__exit__` with the unwind as its error."""
    if is_stop(args[1] if len(args) > 1 else kwargs.get("exc_val")):
        return False
    return wrapped(*args, **kwargs)


def on_unraisable(wrapped, instance, args, kwargs):
    """A wrapt wrapper of sys.unraisablehook: our Stop (or a chained handler's SystemExit),
    swallowed in a finalizer, is not printed; the helper sends SIGTERM again once the main
    thread has left this hook. A process whose helper never started (nothing armed: a chained
    handler's) starts it here: no thread of ours can hold its lock."""
    unraisable = args[0] if args else kwargs.get("unraisable")
    exc = getattr(unraisable, "exc_value", None)
    if isinstance(exc, Stop) and _state.installed or isinstance(exc, SystemExit) and _raised_by_a_chained_handler(exc):
        if not threads.soon(_resend_signal):
            threads.alarm(time.monotonic(), _resend_signal)
        return None
    return wrapped(*args, **kwargs)


def _resend_signal() -> None:
    """Send the swallowed SIGTERM again once the main thread has left the unraisable
    hook (the handler would raise into it): polled every millisecond."""
    if main_thread_in(on_unraisable.__code__):
        threads.alarm(time.monotonic() + 0.001, _resend_signal)
        return
    _state.raised = False
    os.kill(os.getpid(), signal.SIGTERM)


def main_thread_in(code) -> bool:
    """Is the main thread running this code object now (somewhere in its stack)?"""
    frame = cpython.frame_of(_state.main or 0)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None


def _on_wakeup(data: bytes) -> None:
    """In the helper, after each wake: set the deadlines of rule 4 once a SIGTERM is taken
    (the wakeup fd carries every Python-handled signal's number; our handler's wake, a zero byte)."""
    if _state.watched or _state.take_over is None:
        return
    if _state.received is None and not (
            signal.SIGTERM in data and _state.own_wakeup and signal.getsignal(signal.SIGTERM) is _handler):
        return
    _state.watched = True
    signum, at = _state.received or (signal.SIGTERM, time.monotonic())
    take_over = _state.take_over
    threads.alarm(at + deadlines.WAIT_FOR_MAIN_THREAD, lambda: _state.raised or take_over(signum, at, "no unwind"))
    threads.alarm(deadlines.take_over_at(at), lambda: take_over(signum, at, "not torn down at half the deadline"))
    threads.alarm(deadlines.hard_end(deadlines.of_ending(at)), lambda: end_process(signum))


# ---- ending a process ----------------------------------------------------------

def spare(pid: int) -> None:
    """Leave this child running when the process ends: its work outlives the process."""
    _state.spared.add(pid)


def end_process(signum: int | None = None, code: int = 0) -> None:
    """End this process now: SIGTERM the multiprocessing children it started but did not
    `spare` (a pool's workers, orphaned without the shim) by processes.py's rule, with
    CHILDREN_GRACE, then die of `signum` as its default action would, or exit with `code`."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    processes.terminate([p for p in cpython.children() if p.pid not in _state.spared], CHILDREN_GRACE)
    if signum is not None:
        cpython.default_action(signum)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        time.sleep(1)
        code = 128 + signum
    os._exit(code)
