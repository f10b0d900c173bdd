"""ClearML tasks: a SIGTERM ends the job, and the task as "stopped" with every scalar it reported.

clearml (2.1) ends its main task from its exit hook (`Task._at_exit`) with its true state:
completed, failed (an exception, a non-zero `sys.exit`), stopped (Ctrl-C): left to it, as without us.

A SIGTERM is the exception: over the default, clearml's handler does nothing, and the job runs
on, "running". So when a task is recorded the handler from before `Task.init` (the default, or
ours) goes back. The teardown ends the task through clearml's exit path with the signal set:
it is stopped, and its reporting subprocess's last write sends every scalar queued. That
subprocess (a fork) ignores SIGTERM, else a SLURM stop kills it with its scalars and a lock held.

Private (2.1): `ExitHooks._org_handlers`, `.signal`, `.register_signal_and_exception_hooks`, `Reporter._report`,
`Task._Task__exit_hook`, `._Task__main_task`, `._at_exit_called`, `PrintPatchLogger.write`, `BackgroundMonitor`.
"""

import signal
import threading

from .. import exitstatus, registry, signals
from ..patches import Patches
from . import kind_of, recording

KIND = kind_of(__name__)


class _State:
    def __init__(self) -> None:
        self.in_reporter = False  # this is clearml's reporting subprocess (see the docstring)


_state = _State()


def patch(patches: Patches) -> None:
    from clearml import Task
    from clearml.backend_interface.logger import PrintPatchLogger
    from clearml.backend_interface.metrics.reporter import Reporter
    from clearml.utilities.process.exit_hooks import ExitHooks
    from clearml.utilities.process.mp import BackgroundMonitor

    patches.wrap(Task, "init", recording(_record))
    # Raised in them, an unwind can leave a clearml lock held for ever: it waits until they return.
    patches.wrap(PrintPatchLogger, "write", signals.critical)
    patches.wrap(Reporter, "_report", signals.critical)
    patches.wrap(BackgroundMonitor, "_background_process_start", _reporter_starts)
    patches.wrap(ExitHooks, "register_signal_and_exception_hooks", _ignore_sigterm)
    running = vars(Task).get("_Task__main_task")  # one made before we were imported
    if running is not None:
        _record(running)


def _record(task) -> None:
    _give_sigterm_back()
    registry.record(KIND, task)  # arms the engine: our handler goes on a default SIGTERM


def _give_sigterm_back() -> None:
    """If clearml's exit hook holds SIGTERM over the default or ours, that one goes back (as without clearml)."""
    if threading.current_thread() is not threading.main_thread():
        return
    hooks = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    saved: "dict | None" = getattr(hooks, "_org_handlers", None) if type(hooks).__name__ == "ExitHooks" else None
    if not saved or signal.SIGTERM not in saved:
        return
    previous = saved[signal.SIGTERM]
    if previous in (signal.SIG_DFL, None) or getattr(previous, "__module__", "") == signals.__name__:
        signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)
        del saved[signal.SIGTERM]  # else clearml's close() would put its own back (a user's own: left)


def _reporter_starts(wrapped, instance, args, kwargs):
    """In clearml's reporting subprocess, as it starts: SIGTERM ignored (and after it sets its hooks)."""
    _state.in_reporter = True
    _ignore_sigterm(lambda: None, None, (), {})
    return wrapped(*args, **kwargs)


def _ignore_sigterm(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    if _state.in_reporter and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        getattr(instance, "_org_handlers", {}).pop(signal.SIGTERM, None)  # not put back by clearml
    return result


def finalize_one(task, timeout: float) -> "str | None":
    if getattr(task, "_at_exit_called", True):
        return None  # closed by the user, or ended by clearml already
    # 143: a SIGTERM, also one that another handler took (a Ray driver's), as mlflow's integration reads it.
    code = exitstatus.ending()[0]
    received = signals.received() or ((code - 128,) if code == 128 + signal.SIGTERM else None)
    hooks = getattr(type(task), "_Task__exit_hook", None)
    if received is None or hooks is None:
        return "left to clearml's exit hook"  # it runs next, with the true state
    from clearml.utilities.process.mp import BackgroundMonitor

    hooks.signal = received[0]  # clearml's handler would have set it: the task ends "stopped"
    # A reporting thread sends at once; a subprocess, at its next write (5 s), when _at_exit stops it.
    task.flush(wait_for_uploads=not BackgroundMonitor.is_subprocess_enabled(task=task))
    task._at_exit()
    return None


def describe(task) -> str:
    return f"task {getattr(task, 'id', '?')} ({getattr(task, 'name', '?')})"
