"""MLflow runs: end each one with the status the process really ends with, in bounded time.

mlflow's own atexit hook ends only the calling thread's top run, always FINISHED. We record
each run `mlflow.start_run` makes with the stack it was pushed on (any thread, nested,
resumed). At exit (quick store calls, before wandb's teardown) each run still on
its stack is taken off it first, so that mlflow's hook and a tracker's later `end_run()` find
nothing to end, then ended FINISHED, FAILED or KILLED. `MlflowClient.create_run` runs are not
recorded: their id may be another process's.
"""

import _thread
import contextlib
import sys
import time
import weakref

from .. import exitstatus, log, registry, signals
from ..patches import Patches
from . import kind_of, recording

KIND = kind_of(__name__)  # the private names below: tested on 2.10.2 and 3.17


class _State:
    def __init__(self) -> None:
        # ActiveRun -> (the stack it was pushed on, tracking URI)
        self.runs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.deadlines: "dict[int, float]" = {}  # thread ident -> deadline, for the teardown's own requests
        self.accepted: "tuple[str, ...]" = ()   # the HTTP settings this mlflow's http_request takes as arguments


_state = _State()


def patch(patches: Patches) -> None:
    try:
        import mlflow.tracking.fluent as fluent
    except ImportError:
        return  # mlflow-tracing: no runs to end
    if not hasattr(fluent, "start_run"):
        return
    import inspect

    from mlflow.utils import rest_utils

    # Bound under several names: start_run in mlflow and its fluent module, http_request in the stores.
    patches.rebind(fluent.start_run, recording(lambda run: _record(run, _stack())), "mlflow")
    _state.accepted = tuple(inspect.signature(rest_utils.http_request).parameters)
    patches.rebind(rest_utils.http_request, _bounded_request, "mlflow")
    patches.wrap(fluent.ActiveRun, "__exit__", signals.exit_unless_stopped)  # the teardown ends it KILLED, not FAILED
    stack = _stack()  # a run started before we were imported
    for run in list(stack or ()):
        _record(run, stack)


def _stack():
    """The calling thread's active-run stack (the one global list in 2.10), or None."""
    stacks = getattr(sys.modules.get("mlflow.tracking.fluent"), "_active_run_stack", None)
    return stacks if isinstance(stacks, list) or stacks is None else stacks.get()


def _record(run, stack):
    if stack is None or not any(r is run for r in stack):
        return
    import mlflow

    # The stack, not the thread: a new thread with a dead one's ident replaces its stack.
    # The URI: a later set_tracking_uri() must not send our end to another store.
    _state.runs[run] = (stack, mlflow.get_tracking_uri())
    registry.record(KIND, run)


def finalize_one(run, timeout: float) -> "str | None":
    """End the run (and the runs nested above it) with the status the process ends with."""
    stack, uri = _state.runs.pop(run, (None, None))
    index = next((i for i, r in enumerate(stack or ()) if r is run), None)
    if index is None:
        return None  # ended by the user: end_run() or the end of a `with` block
    # Off the stack before any call that can hang; nested runs above it end first.
    ending = stack[index:]
    del stack[index:]
    code, exception, _ = exitstatus.ending()
    # 143 is a SIGTERM's code also where the signal was another handler's (a Ray actor's).
    killed = isinstance(exception, KeyboardInterrupt) or signals.received() is not None or code == 128 + 15
    status = "KILLED" if killed else "FINISHED" if code == 0 and exception is None else "FAILED"
    with bounded(timeout):
        return ", ".join([_end(each.info.run_id, status, uri) for each in reversed(ending)])


@contextlib.contextmanager
def bounded(timeout: float):
    """This thread's MLflow requests in the block end within `timeout` seconds from now: a run
    ended for the user must not wait out mlflow's retries (minutes) against a server that is gone."""
    ident = _thread.get_ident()
    _state.deadlines[ident] = time.monotonic() + timeout
    try:
        yield
    finally:
        _state.deadlines.pop(ident, None)


def _end(run_id, status, uri):
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        info = client.get_run(run_id).info
        if info.status in ("FINISHED", "FAILED", "KILLED"):
            return f"already {info.status}"  # the user ended it through the client
        if info.lifecycle_stage == "deleted":
            return "deleted"  # mlflow.delete_run(): the store refuses to update it
        client.set_terminated(run_id, status)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        log.warning("mlflow run %s left RUNNING: %s: %s", run_id, type(exc).__name__, first)
        return f"left RUNNING: {type(exc).__name__}"
    fluent = sys.modules.get("mlflow.tracking.fluent")
    monitor = getattr(fluent, "run_id_to_system_metrics_monitor", {}).pop(run_id, None)
    if monitor is not None:  # log_system_metrics=True: what end_run() does after set_terminated
        monitor.finish()
    return f"ended {status}"


def _bounded_request(wrapped, instance, args, kwargs):
    """A request in a `bounded` block (three per run at most): each a third of the time left,
    one immediate retry for a dropped connection."""
    deadline = _state.deadlines.get(_thread.get_ident())
    if deadline is not None:
        left = deadline - time.monotonic()
        bounds = {"max_retries": 1 if left > 1.0 else 0, "backoff_factor": 0, "backoff_jitter": 0.0,
                  "timeout": max(0.1, left / 3), "respect_retry_after_header": False}
        kwargs.update({k: v for k, v in bounds.items() if k in _state.accepted})
    return wrapped(*args, **kwargs)


def describe(run) -> str:
    info = run.info
    return f"run {info.run_id}" + (f" ({info.run_name})" if info.run_name else "")
