"""How the process is ending: the exit status the teardown reports and hands on (a run's
exit code, its state), which Python does not say until after our hook has run.

`ending()` takes the first that applies:

1. `hand_on(n)`: the caller knows (a Ray Train worker's function raised).
2. A SIGTERM taken (signals.py): 128 + signum (the process then dies of it).
3. The uncaught exception that ended __main__ (KeyboardInterrupt too): 1. Trusted only
   outside interactive sessions and when its traceback starts in __main__'s own frame
   (a REPL or code.interact() leave stale ones behind).
4. A multiprocessing child's exit code (`multiprocessing_exit`).
5. The SystemExit that left __main__: its code (None 0, a message 1).
6. 0: __main__ ran to its end, or Python hides how it ended.

To see 5, `track()` uses sys.monitoring's PY_UNWIND on 3.12+ (a bare `raise
SystemExit(n)` too); before (or with no free tool id) it wraps sys.exit(), whose call
counts only if every frame from its caller up to __main__'s stopped where it was then:
the SystemExit was not caught.
"""

import _thread
import sys

from . import cpython, forksafe
from .patches import Patches


class _State:
    """What this process has seen of its own ending; a fork child starts with a new one, and keeps
    the sys.monitoring tool id (the interpreter's, inherited)."""

    def __init__(self, monitoring_tool: "int | None" = None) -> None:
        self.handed_on: int | None = None   # hand_on(n) of the teardown under way
        self.sys_exit: tuple | None = None  # (code, [(frame, f_lasti)]) of the SystemExit leaving __main__
        self.mp_exitcode: int | None = None  # a multiprocessing child's exit code
        self.monitoring_tool = monitoring_tool  # the sys.monitoring tool id taken (track)


_state = _State()
_patches = Patches()


def ending() -> tuple[int, BaseException | None, str]:
    """(code, uncaught exception or None, trigger): see the module docstring."""
    from . import signals

    if _state.handed_on is not None:
        return _state.handed_on, None, f"finalize(exit_code={_state.handed_on})"
    received = signals.received()
    if received is not None:
        return 128 + received[0], None, "SIGTERM"
    exc = _uncaught()
    if exc is not None:
        return 1, exc, type(exc).__name__ if isinstance(exc, KeyboardInterrupt) else "exception"
    if _state.mp_exitcode is not None:
        return _state.mp_exitcode, None, "multiprocessing exit"
    status = _state.sys_exit
    if status is not None and all(frame.f_lasti == lasti for frame, lasti in status[1]):
        return code_of(status[0]), None, f"sys.exit({status[0]!r})"
    return 0, None, "normal end" if signals.exiting() else "finalize()"


def hand_on(code: int | None) -> None:
    """The exit code of the teardown under way is `code` (None: infer it again)."""
    _state.handed_on = code


def multiprocessing_exit(exc: BaseException | None) -> None:
    """A multiprocessing child's run() ended with `exc` (None: returned)."""
    _state.mp_exitcode = 0 if exc is None else code_of(exc.code) if isinstance(exc, SystemExit) else 1


def code_of(status: object) -> int:
    """The exit status of SystemExit(status): None 0, a message 1."""
    return 0 if status is None else status if isinstance(status, int) else 1


def _uncaught() -> BaseException | None:
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


def track() -> None:
    """See the SystemExit that leaves __main__ (once per process; a fork child inherits it)."""
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None and _state.monitoring_tool is None:
        for tool in (4, 3):
            try:
                monitoring.use_tool_id(tool, "autoteardown")
            except ValueError:  # taken (a debugger, coverage, a profiler)
                continue
            monitoring.register_callback(tool, monitoring.events.PY_UNWIND, _on_unwind)
            monitoring.set_events(tool, monitoring.events.PY_UNWIND)
            _state.monitoring_tool = tool
            return
    if _state.monitoring_tool is None:
        _patches.wrap(sys, "exit", _on_sys_exit)


def untrack() -> None:
    _patches.restore()
    if _state.monitoring_tool is not None:
        monitoring = sys.monitoring  # type: ignore[attr-defined]  # 3.12+, where a tool id was taken
        monitoring.set_events(_state.monitoring_tool, 0)
        monitoring.register_callback(_state.monitoring_tool, monitoring.events.PY_UNWIND, None)
        monitoring.free_tool_id(_state.monitoring_tool)
        _state.monitoring_tool = None


def _on_sys_exit(wrapped, instance, args, kwargs):
    # Only the main thread's call ends the process (a step, in a runner, may call it too).
    if _thread.get_ident() == _main_ident():
        main, frames, frame = getattr(sys.modules.get("__main__"), "__dict__", None), [], cpython.caller()
        while frame is not None:
            frames.append((frame, frame.f_lasti))
            if frame.f_code.co_name == "<module>" and frame.f_globals is main:
                _state.sys_exit = (args[0] if args else kwargs.get("status"), frames)
                break
            frame = frame.f_back
    return wrapped(*args, **kwargs)


def _on_unwind(code, offset, exception):
    if (isinstance(exception, SystemExit) and code.co_name == "<module>"
            and cpython.caller().f_globals is getattr(sys.modules.get("__main__"), "__dict__", None)
            and _thread.get_ident() == _main_ident()):
        _state.sys_exit = (exception.code, ())


def _main_ident() -> int | None:
    import threading

    return threading.main_thread().ident


def _after_fork_in_child() -> None:
    global _state
    _state = _State(_state.monitoring_tool)


forksafe.register(__name__, _after_fork_in_child)
