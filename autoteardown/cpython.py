"""CPython's private internals, all of them here: what the exit needs and no public API gives.

Each is looked up when it is used, never at import, and where a Python lacks it the fallback is
the behaviour without the shim, never an error. Checked on CPython 3.10, 3.11, 3.12 and 3.13 (the
CI matrix); tests/test_structure.py keeps every use in this module.

- Frames (`sys._getframe`, `sys._current_frames`; all four): who called us, where a thread is.
- threading's exit (`_register_atexit`, `_SHUTTING_DOWN`, 3.9+; `_shutdown`; all four): a callback
  that runs before Python joins the non-daemon threads and before any atexit callback; the join.
- multiprocessing's child exit (`util._exit_function`, `BaseProcess._bootstrap`,
  `process._children` and a process's `_parent_pid`; all four): a child's exit path, which runs
  no atexit, and the children a process started.
- A module being imported (`ModuleSpec._initializing`; all four).
- A signal's handler as set (`_signal.getsignal`; all four), in the few bytecodes a handler has.
- ctypes (all four): libc's signal() from a thread other than the main one, and
  `PyThreadState_SetAsyncExc`, an exception raised in another thread at its next bytecode.
"""

import os
import sys

TYPE_CHECKING = False  # typing costs more than the rest of `import autoteardown`
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Callable

    from .patches import Patches


# ---- frames --------------------------------------------------------------------

def caller(depth: int = 1) -> "FrameType":
    """The frame `depth` levels above the function that calls this (1: that function's caller)."""
    return sys._getframe(depth + 1)


def frame_of(ident: int) -> "FrameType | None":
    """The innermost frame of the thread `ident` now, None if it has ended."""
    return sys._current_frames().get(ident)


def all_frames() -> "list[FrameType]":
    """The innermost frame of every thread now."""
    return list(sys._current_frames().values())


def importing(module: str) -> bool:
    """Is `module` being imported now (its body still running)?"""
    return bool(getattr(getattr(sys.modules.get(module), "__spec__", None), "_initializing", False))


# ---- threading's exit ----------------------------------------------------------

def before_threads_join(callback: "Callable[[], None]") -> bool:
    """Have `callback` called first at the interpreter's exit, before it joins the non-daemon
    threads and before any atexit callback; False where that cannot be (already shutting down)."""
    import threading

    register = getattr(threading, "_register_atexit", None)
    if register is None or getattr(threading, "_SHUTTING_DOWN", False):
        return False
    register(callback)
    return True


def join_threads() -> None:
    """What the interpreter's exit does first: join the non-daemon threads, mark the main one stopped
    (a second call returns at once)."""
    import threading

    threading._shutdown()  # type: ignore[attr-defined]


# ---- multiprocessing -----------------------------------------------------------

def wrap_child_exit(patches: "Patches", wrapper: "Callable[..., Any]") -> None:
    """Wrap multiprocessing's exit function, which `BaseProcess._bootstrap` calls as a child ends
    (atexit never runs there), if multiprocessing is imported."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        patches.wrap(util, "_exit_function", wrapper)


def in_child_bootstrap(frame: "FrameType | None") -> bool:
    """Is `frame`, or one of its callers, multiprocessing's `BaseProcess._bootstrap` (a child's exit)?"""
    bootstrap = getattr(sys.modules.get("multiprocessing.process"), "BaseProcess", None)
    code = getattr(getattr(bootstrap, "_bootstrap", None), "__code__", None)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None


def children() -> list:
    """The multiprocessing children this process started and has not joined."""
    started = getattr(sys.modules.get("multiprocessing.process"), "_children", ())
    return [p for p in list(started) if getattr(p, "_parent_pid", None) == os.getpid()]


def disown(processes) -> None:
    """Take these processes off multiprocessing's list of children (which its exit would SIGTERM)."""
    started: "set[Any]" = getattr(sys.modules.get("multiprocessing.process"), "_children", set())
    for process in processes:
        started.discard(process)


# ---- signals -------------------------------------------------------------------

def handler_of(signum: int) -> object:
    """signal.getsignal(signum) without its enum conversion (`_signal.getsignal`, all four), which
    raises and catches a ValueError for every Python handler: dozens of bytecodes, and at each a
    signal that comes meanwhile (a worker's SIGCHLD) runs its handler nested in the caller's."""
    import _signal

    return _signal.getsignal(signum)


# ---- ctypes --------------------------------------------------------------------

def default_action(signum: int) -> None:
    """SIG_DFL for `signum`, from any thread (the signal module refuses outside the main one; libc does not)."""
    import signal

    try:
        signal.signal(signum, signal.SIG_DFL)
    except ValueError:
        import ctypes

        ctypes.CDLL(None).signal(int(signum), 0)  # 0 is SIG_DFL


def raise_in_thread(ident: int, exc_type: type) -> None:
    """Raise `exc_type` in the thread `ident` at its next bytecode (not inside C code)."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))
