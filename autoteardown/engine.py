"""The exit engine: one teardown that finalizes every recorded resource, in order,
within a deadline, however the process ends, and never changes how it ends.

It starts from threading's exit callbacks, which CPython calls before it joins the
non-daemon threads and before any atexit callback (torch, wandb and Ray register theirs
after us). After a SIGTERM it tears down there, at once, then the process dies of the
signal (signals.py); a normal end tears down from the atexit callback registered there,
the last registered and so the first called, once Python has joined the non-daemon
threads. Armed at the first resource recorded once a kind is declared (registry.py).

What it waits for: work whose result outlives the process (a tracker's records, a
checkpoint being written), within the budget. A process it ends is ended as the
process would end it without the shim, never sooner (integrations/torch.py's workers).

Each step runs in a runner thread (threads.py) and may use its share of the deadline
(deadlines.py: made once, where the ending begins, and handed down); another runner
drives the steps, so the calling thread only waits, the one place that can ignore what
a signal handler raises (torch's SIGCHLD one). Without a runner, a step runs inline
under an alarm. Errors are one warning, never raised.
The exit status handed on is exitstatus.py's.
"""

import _thread
import os
import sys
import time

from . import config, cpython, deadlines, exitstatus, forksafe, log, registry
from .patches import Patches

TYPE_CHECKING = False  # typing costs more than the rest of `import autoteardown`
if TYPE_CHECKING:
    from typing import Any, Callable

    FinalizeOne = Callable[[Any, float], Any]
    AfterAll = Callable[[float], Any]
    PerObject = Callable[[Any], Any]


LEFT_BEHIND = "left behind"


class Kind:
    """How to finalize the resources of one kind, and when (lower `order` first):
    finalize_one(obj, timeout) (a string it returns is the report's outcome; LEFT_BEHIND: it left
    work waiting on what does not answer, as a step that runs over does), after_all(timeout)
    once after them, in_child(obj) in a fork child for each object the parent had,
    on_sigterm(obj) in the SIGTERM handler (no lock, no blocking)."""

    __slots__ = ("name", "order", "finalize_one", "after_all", "in_child", "on_sigterm")

    def __init__(self, name: str, order: int, finalize_one: "FinalizeOne", after_all: "AfterAll | None" = None,
                 in_child: "PerObject | None" = None, on_sigterm: "PerObject | None" = None) -> None:
        self.name, self.order, self.finalize_one = name, order, finalize_one
        self.after_all, self.in_child, self.on_sigterm = after_all, in_child, on_sigterm


class _State:
    """The engine's state in this process; a fork child starts with a new one."""

    def __init__(self, hooked: bool = False) -> None:
        self.lock = _thread.RLock()
        self.busy = _thread.allocate_lock()  # held by the teardown under way
        self.finalizer: int | None = None    # ident of the thread that asked for it
        self.stepping: set[int] = set()      # idents of the threads running a step now
        self.armed_pid: int | None = None
        self.signals_ready = False  # signals.install() ran in the main thread of this process
        self.hooked = hooked        # the exit hooks are registered (a fork child inherits them)
        self.exit_done = False      # the exit teardown has run
        self.left_behind = False    # a step of a teardown was still running at its budget


_state = _State()
_kinds: "list[Kind]" = []             # by order
_when_armed: "list[Callable[[], None]]" = []  # quick hooks called when a process is armed
_patches = Patches()


def register_kind(kind: str, order: int, finalize_one: "FinalizeOne", after_all: "AfterAll | None" = None,
                  in_child: "PerObject | None" = None, on_sigterm: "PerObject | None" = None) -> None:
    """Declare how to finalize resources of `kind` (see Kind). A process with a kind declared
    arms at its next record (registry.py), not before: most processes never record."""
    with _state.lock:
        _kinds[:] = sorted([k for k in _kinds if k.name != kind] + [
            Kind(kind, order, finalize_one, after_all, in_child, on_sigterm)], key=lambda k: k.order)
        if not _state.signals_ready:
            registry.call_at_record(arm)


def when_armed(hook: "Callable[[], None]") -> None:
    """Call hook() (quick, never raising) whenever a process is armed: it has something to tear down."""
    if hook not in _when_armed:
        _when_armed.append(hook)


def arm() -> None:
    """Exit hooks, runners, exit-status tracking and SIGTERM, once per process (SIGTERM from
    the main thread only: else again at the next record)."""
    from . import signals, threads

    with _state.lock:
        if _state.armed_pid != os.getpid():
            _state.armed_pid = os.getpid()
            if not _state.hooked:
                _state.hooked = True
                _hook_exit()
            exitstatus.track()
            threads.start_runner()  # two: one drives the steps, one runs them
            threads.start_runner()
            cpython.wrap_child_exit(_patches, _before_multiprocessing_exit)
            _report("header")
            for hook in _when_armed:
                hook()
        if not _state.signals_ready:
            _state.signals_ready = signals.install(on_sigterm, _take_over)
        registry.call_at_record(None if _state.signals_ready else arm)


def disarm() -> None:
    """Undo arm() as far as possible (the threading exit hooks stay, and do nothing)."""
    _state.armed_pid, _state.signals_ready = None, False
    registry.call_at_record(None)  # the gate's next register_kind sets it again
    _patches.restore()
    exitstatus.untrack()
    from . import signals

    signals.uninstall()


def finalize(timeout: float | None = None, kinds=None, exit_code: int | None = None) -> None:
    """Finalize every live resource now (or those of `kinds`) within `timeout` seconds,
    handing on `exit_code` if given. A KeyboardInterrupt or SystemExit while waiting
    stops the teardown (the rest stays recorded) and is raised again."""
    interrupted = _finalize(deadlines.of_ending(timeout=timeout), kinds, exit_code)
    if interrupted is not None:
        raise interrupted


def _finalize(deadline: float, only=None, exit_code: int | None = None, why: str | None = None):
    """One teardown, never raising; returns what interrupted the waiting thread, if anything."""
    state = _state
    if state.finalizer == _thread.get_ident() or _thread.get_ident() in state.stepping:
        return None  # a step called finalize() (ray.shutdown() in a finalizer)
    if not state.busy.acquire(timeout=max(0.0, deadline - time.monotonic())):
        log.warning("another teardown is still running; not finalized")
        return None
    stop: "list[BaseException]" = []
    state.finalizer = _thread.get_ident()
    exitstatus.hand_on(exit_code)
    outcome, interrupted, _ = _in_runner(_run_steps, (deadline, only, stop, why), deadlines.hard_end(deadline), "the teardown")
    if outcome and isinstance(outcome[0], BaseException):
        log.debug_exception("finalize failed", exc_info=outcome[0])
    if interrupted is not None:
        stop.append(interrupted)  # the steps stop before the next one; the rest stay recorded
        log.warning("teardown interrupted (%s)", type(interrupted).__name__)
    return interrupted


def _run_steps(deadline: float, only, stop: list, why: str | None) -> None:
    """The teardown's steps, in a runner; it ends the teardown (`busy`) when they are done."""
    state, started, steps = _state, time.monotonic(), []  # type: _State, float, list[tuple]
    for kind in list(_kinds):  # a copy is atomic, as on_sigterm's
        objs = registry.live(kind.name) if only is None or kind.name in only else ()
        steps += [(kind.name, obj, kind.finalize_one) for obj in objs]
        steps += [(kind.name, None, kind.after_all)] * bool(kind.after_all and objs)
    try:
        if steps or only is None:  # a partial finalize() with nothing to do: the exit reports
            code, _, trigger = exitstatus.ending()
            _report("begin", why or trigger, code)
        for index, (kind_name, obj, func) in enumerate(steps):
            remaining, left = deadline - time.monotonic(), len(steps) - index
            if stop:
                break
            if remaining <= 0:
                log.warning("deadline reached; not finalized: %s", ", ".join(_name(k, o) for k, o, _ in steps[index:]))
                break
            if obj is not None:
                registry.forget(obj)  # just before its step: an interrupted teardown leaves the rest
            _run_bounded(kind_name, obj, func, deadlines.share(deadline, left - 1))
        if steps or only is None:
            _report("end", time.monotonic() - started, bool(stop))
    finally:
        state.finalizer = None
        exitstatus.hand_on(None)
        state.busy.release()


def _wait(done, until: float, what: str):
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


def _in_runner(func, args: tuple, until: float, what: str):
    """func(*args) in a runner thread, waited for until `until`: ([its result or exception],
    or [] while it runs on; what stopped the wait; [the runner's ident]). With no thread to be
    had it runs inline, and should it hang, the process ends with its status a second after `until`."""
    from . import signals, threads

    outcome: list = []
    runner: list = []
    done, stepping = _thread.allocate_lock(), _state.stepping
    done.acquire()

    def run() -> None:
        runner.append(_thread.get_ident())
        stepping.add(_thread.get_ident())
        try:
            outcome.append(func(*args))
        except BaseException as exc:  # SystemExit too: a library may call sys.exit() in a step
            outcome.append(exc)
        finally:
            stepping.discard(_thread.get_ident())
            done.release()

    if threads.submit(run):
        return outcome, _wait(done, until, what), runner
    guard = threads.alarm(deadlines.hard_end(until), lambda: signals.end_process(code=exitstatus.ending()[0]))
    try:
        run()
    finally:
        threads.cancel(guard)
    return outcome, None, runner


def _run_bounded(kind: str, obj, func, budget: float) -> None:
    """Run one step in a runner thread and wait at most `budget` seconds for it."""
    started = time.monotonic()
    outcome, _, runner = _in_runner(func, (budget,) if obj is None else (obj, budget), started + budget, kind)
    elapsed, name = time.monotonic() - started, _name(kind, obj)
    result = outcome[0] if outcome else LEFT_BEHIND
    _state.left_behind |= result == LEFT_BEHIND
    if not outcome:
        log.warning("%s: still running after %.1fs%s; left behind", name, elapsed, _where(runner))
    elif isinstance(result, BaseException) and not isinstance(result, SystemExit):
        log.warning("%s: %s: %s", name, type(result).__name__, result)
        log.debug_exception("%s failed", name, exc_info=result)
        result = f"failed: {type(result).__name__}: {result}"
    _report("step", kind, obj, result if isinstance(result, str) else "finalized", elapsed)


def _where(runner: list) -> str:
    """Where a step that runs over is now (the whole stack in the debug log): its innermost frame
    and, when that is the standard library's (a lock, a join), the library call that waits in it."""
    frame = cpython.frame_of(runner[0]) if runner else None
    if frame is None:
        return ""
    if config.DEBUG:
        import traceback

        log.debug("the step's stack:\n%s", "".join(traceback.format_stack(frame)).rstrip())
    stdlib = os.path.dirname(os.__file__)
    frames = [frame]
    while frames[-1].f_code.co_filename.startswith(stdlib) and "-packages" not in frames[-1].f_code.co_filename \
            and frames[-1].f_back is not None:
        frames.append(frames[-1].f_back)
    shown = [frames[0]] + frames[-1:] * (len(frames) > 1)
    return " in " + " from ".join(
        f"{f.f_code.co_name} ({f.f_code.co_filename.rpartition(os.sep)[2]}:{f.f_lineno})" for f in shown)


def _name(kind: str, obj) -> str:
    name = _report("describe", kind, obj)
    return f"{kind} {name or ('(after all its resources)' if obj is None else type(obj).__name__)}"


def _report(event: str, *args):
    """report.py's `event`, imported only when a report is asked for; never raises."""
    try:
        if config.DEBUG or config.REPORT:
            from . import report

            return getattr(report, event)(*args)
    except Exception:
        log.debug_exception("teardown report: %s failed", event)
    return None


# ---- the exit hooks ---------------------------------------------------------------

def _hook_exit() -> None:
    # Called before Python joins the non-daemon threads, and before every atexit callback.
    if not cpython.before_threads_join(_on_exit):  # already shutting down
        import atexit

        atexit.register(_on_exit_after_threads)


def _on_exit() -> None:
    """Called first among threading's exit callbacks: after a SIGTERM, tear down now; else
    register the teardown as the last atexit callback, so that it runs first of them."""
    import atexit

    from . import signals

    if _state.armed_pid != os.getpid():
        return  # inherited through fork: the parent's business
    signals.begin_exit()
    if signals.received() is not None and not _state.exit_done:
        _exit_teardown()
    else:
        atexit.register(_on_exit_after_threads)


def _on_exit_after_threads() -> None:
    """A normal end tears down once Python has joined the non-daemon threads, and before any
    other atexit callback (torch's, wandb's, multiprocessing's: atexit is last-in-first-out,
    and this is registered last, from threading's exit callback). Python marks the main thread
    stopped before that join, so a thread that waits for it (`main_thread().join()`, an
    `is_alive()` loop) ends as it would without us; a thread still using a DataLoader or a run
    has ended before they are torn down."""
    from . import signals

    if _state.armed_pid != os.getpid() or _state.exit_done:
        return
    signals.begin_exit()
    _exit_teardown()


def _before_multiprocessing_exit(wrapped, instance, args, kwargs):
    """A multiprocessing child's exit (cpython.wrap_child_exit) SIGTERMs the daemonic
    children (DataLoader workers), then joins the threads, and never runs atexit: a
    multiprocessing child runs Python's exit in that order itself first (the non-daemon
    threads joined, the main thread marked stopped: a second call returns at once), then
    tears down, with the code run()'s outcome gives it."""
    if cpython.in_child_bootstrap(cpython.caller()) and _state.armed_pid == os.getpid() and not _state.exit_done:
        exitstatus.multiprocessing_exit(sys.exc_info()[1])
        try:
            cpython.join_threads()
        except BaseException as exc:  # a Ctrl-C in the join: the teardown still runs
            log.debug("joining the threads: %r", exc)
        _on_exit_after_threads()
    return wrapped(*args, **kwargs)


def _exit_teardown() -> None:
    from . import signals, threads

    _state.exit_done = True
    received = signals.received()
    deadline = deadlines.of_ending(received[1] if received else None)
    interrupted = _finalize(deadline)
    if interrupted is not None:
        log.debug("exit teardown cut short by %r", interrupted)
    received = signals.received()
    if received is not None:  # a SIGTERM before or during the teardown: die of it, as without us
        signals.end_process(received[0])
    if _state.left_behind:
        # What holds a step (a server that does not answer) holds the libraries' own exit hooks
        # too: past the deadline the process ends as it was ending, whatever still runs.
        threads.alarm(deadlines.hard_end(deadline), _end_as_ending)


def _end_as_ending() -> None:
    import signal

    from . import signals

    code, exception, _ = exitstatus.ending()
    signals.end_process(signal.SIGINT if isinstance(exception, KeyboardInterrupt) else None, code=code)


# ---- signals (handed to signals.py) -----------------------------------------------

def on_sigterm(signum: int) -> None:
    """In a SIGTERM handler (no lock, no logging): each kind's on_sigterm (the DataLoader
    workers die with the process group). Ray's chained handler calls it too."""
    for kind in list(_kinds):
        for obj in registry.live(kind.name) if kind.on_sigterm else ():
            try:
                kind.on_sigterm(obj)  # type: ignore[misc]
            except Exception:
                pass


def _take_over(signum: int, at: float, why: str) -> None:
    """signals.py's rule 4: unless a teardown is under way, tear down and die of the signal."""
    from . import signals, threads

    if _state.busy.locked():
        return
    if signals.received() is None:
        signals.record(signum, at)
        on_sigterm(signum)
    log.debug("SIGTERM: %s after %.1fs; tearing down from a helper thread", why, time.monotonic() - at)

    def work() -> None:
        _finalize(deadlines.of_ending(at), why="SIGTERM")
        signals.end_process(signum)

    threads.run_soon(work)


# ---- fork safety -----------------------------------------------------------------------

def _after_fork_in_child() -> None:
    """A fork child starts with no resources and the default SIGTERM until it records one."""
    global _state
    installed = _state.armed_pid is not None or registry.calls_at_record()
    _state = _State(hooked=_state.hooked)
    if installed:  # arm at the child's first record
        registry.call_at_record(arm)
    in_child = {kind.name: kind.in_child for kind in _kinds if kind.in_child is not None}
    for kind, obj in registry.take_all():
        callback = in_child.get(kind)
        if callback is not None:
            try:
                callback(obj)
            except Exception:
                log.debug_exception("fork child: %s cleanup failed", kind)


forksafe.register(__name__, _after_fork_in_child)
