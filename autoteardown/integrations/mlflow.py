"""MLflow runs: end each one with the status the process really ends with, in bounded time.

mlflow ends runs at exit from `atexit.register(_safe_end_run)`: `end_run()`, status
FINISHED, for the top of the *calling thread's* active-run stack only (mlflow 3 keeps
one stack per thread; 2.10 one global list). So an exception, sys.exit(3) and Ctrl-C
all record FINISHED, SIGTERM leaves the run RUNNING, and so does a run of another
thread; against a tracking server that is gone, `end_run()` retries for minutes
(README "MLflow runs" has the figures).

We wrap `mlflow.start_run` (where `mlflow` and `mlflow.tracking.fluent` bind it) and
record each ActiveRun with the stack it was pushed on, so runs of any thread, nested
and resumed ones too, are seen. At exit (order 28: one or two quick store calls, so
before wandb's teardown, which can take seconds) each run still on its stack is taken
off it first, so that mlflow's own hook and a tracker's later `end_run()` (verl and
SkyRL end runs in `__del__`) find nothing to end again, then ended FINISHED, FAILED or
KILLED. A run the user ended is left alone: `end_run()` and `with` take it off the
stack; one ended through `MlflowClient.set_terminated` shows a terminal status when we
look it up. Runs made by `MlflowClient.create_run` are not recorded: that API leaves
ending the run to the caller, and handing its id to another process is an ordinary use.

Bounded: mlflow's HTTP retries, backoff and timeout are cut to the step's budget for
the teardown's own requests only (a wrapper of `rest_utils.http_request` that passes
them as arguments), so the user's settings and calls are untouched.
"""

import sys
import time
import _thread
from _weakref import ref

from .. import engine, log, registry
from . import Patches, get_version as _version, supported

NAME = KIND = "mlflow"
ORDER = 28  # the private names below: tested on 2.10.2 and 3.17
TERMINAL = ("FINISHED", "FAILED", "KILLED")
_patches = Patches()
_runs = {}       # id(ActiveRun) -> (weak ref to it, the stack it was pushed on, tracking URI)
_deadlines = {}  # thread ident -> deadline, for the teardown's own requests
_accepted = ()   # the HTTP settings this mlflow's http_request takes as arguments


def get_version():
    return _version(NAME)


def patch():
    global _accepted
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is None:
        try:  # `import mlflow` imports it; a bare `import mlflow.tracking` may not have yet
            import mlflow.tracking.fluent as fluent
        except ImportError:
            return  # mlflow-tracing: no runs to end
    if _patches or not hasattr(fluent, "start_run") or not supported(NAME):
        return
    import inspect

    from mlflow.utils import rest_utils

    _patches.rebind(fluent.start_run, _record_run, "mlflow")  # mlflow and mlflow.tracking.fluent bind it
    _accepted = tuple(inspect.signature(rest_utils.http_request).parameters)
    _patches.rebind(rest_utils.http_request, _bounded_request, "mlflow")
    engine.register_kind(KIND, ORDER, end_run, in_child=forget_in_child)
    _patches.wrap(fluent.ActiveRun, "__exit__", _exit_unless_stopped)
    stack = _stack()  # a run started before we were imported
    for run in list(stack or ()):
        _record(run, stack)


def unpatch():
    _patches.restore()


def _stack():
    """The calling thread's active-run stack (the one global list in 2.10), or None."""
    stacks = getattr(sys.modules.get("mlflow.tracking.fluent"), "_active_run_stack", None)
    return stacks if isinstance(stacks, list) or stacks is None else stacks.get()


def _record_run(wrapped, instance, args, kwargs):
    run = wrapped(*args, **kwargs)
    try:
        _record(run, _stack())
    except Exception:
        log.debug_exception("could not record mlflow run %r", run)
    return run


def _exit_unless_stopped(wrapped, instance, args, kwargs):
    if engine.is_stop(args[1] if len(args) > 1 else kwargs.get("exc_val")):
        return False  # the teardown ends the run KILLED, not FAILED
    return wrapped(*args, **kwargs)


def _record(run, stack):
    if stack is None or not any(r is run for r in stack):
        return
    import mlflow

    key = id(run)

    def drop(dead, key=key):
        if _runs.get(key, (None,))[0] is dead:
            _runs.pop(key, None)

    # The stack itself, not the thread: mlflow keeps a dead thread's stack only in a
    # dict keyed by thread ident, which a new thread with the same ident overwrites.
    # The URI too: a later set_tracking_uri() must not send our end to another store.
    _runs[key] = (ref(run, drop), stack, mlflow.get_tracking_uri())
    registry.record(KIND, run)


def forget_in_child(run):
    # mlflow 3 resets its per-thread stacks in a fork child; the parent's runs are the
    # parent's to end, so the child forgets them too.
    _runs.pop(id(run), None)


def _status():
    code, exception, _ = engine.ending()
    if isinstance(exception, KeyboardInterrupt) or engine.exit_signal() is not None:
        return "KILLED"
    return "FINISHED" if code == 0 and exception is None else "FAILED"


def end_run(run, timeout):
    entry = _runs.pop(id(run), None)
    if entry is None or entry[0]() is not run:
        return None
    _, stack, uri = entry
    index = next((i for i, r in enumerate(stack) if r is run), None)
    if index is None:
        return None  # ended by the user: end_run() or the end of a `with` block
    # Off the stack before any call that can hang, so that mlflow's atexit hook (and a
    # tracker's end_run() in __del__) cannot end it again, as FINISHED, later. Nested
    # runs still open above it go first, innermost first, as end_run() would.
    ending = stack[index:]
    del stack[index:]
    status, outcomes = _status(), []
    _deadlines[_thread.get_ident()] = time.monotonic() + timeout
    try:
        for each in reversed(ending):
            outcomes.append(_end(each.info.run_id, status, uri))
    finally:
        _deadlines.pop(_thread.get_ident(), None)
    return ", ".join(outcomes)


def _end(run_id, status, uri):
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        info = client.get_run(run_id).info
        if info.status in TERMINAL:
            return f"already {info.status}"  # the user ended it through the client
        if info.lifecycle_stage == "deleted":
            return "deleted"  # mlflow.delete_run(): the store refuses to update it
        client.set_terminated(run_id, status)
    except Exception as exc:
        message = str(exc).strip().splitlines()
        log.warning("mlflow run %s left RUNNING: %s: %s", run_id, type(exc).__name__, message[0][:200] if message else "")
        return f"left RUNNING: {type(exc).__name__}"
    fluent = sys.modules.get("mlflow.tracking.fluent")
    monitor = getattr(fluent, "run_id_to_system_metrics_monitor", {}).pop(run_id, None)
    if monitor is not None:  # log_system_metrics=True: what end_run() does after set_terminated
        monitor.finish()
    return f"ended {status}"


def _bounded_request(wrapped, instance, args, kwargs):
    """The teardown's requests: three per run at most (our look-up, set_terminated's
    look-up of the run's URL, the update), each a third of the time left, one
    immediate retry for a connection the server dropped."""
    deadline = _deadlines.get(_thread.get_ident())
    if deadline is not None:
        left = deadline - time.monotonic()
        bounds = {"max_retries": 1 if left > 1.0 else 0, "backoff_factor": 0, "backoff_jitter": 0.0,
                  "timeout": max(0.1, left / 3), "respect_retry_after_header": False}
        kwargs.update({k: v for k, v in bounds.items() if k in _accepted})
    return wrapped(*args, **kwargs)


def describe(obj):
    info = getattr(obj, "info", None)
    run_id = getattr(info, "run_id", None) or getattr(obj, "run_id", None) or (obj if isinstance(obj, str) else None)
    name = getattr(info, "run_name", None)
    return (f"run {run_id}" + (f" ({name})" if name else "")) if run_id else None
