"""MLflow runs: end each one with the status the process really ends with, in bounded time.

mlflow (3.17, and 2.10) ends runs at exit from `atexit.register(_safe_end_run)`
in `mlflow/tracking/fluent.py`: `end_run()`, status FINISHED, for the top of the
*calling thread's* active-run stack only. Measured with a sqlite store:
- an uncaught exception, `sys.exit(3)` and KeyboardInterrupt all record FINISHED;
- SIGTERM with the default handler runs no hook: the run stays RUNNING forever;
- a run started in another thread stays RUNNING (3.17 keeps one stack per thread,
  a `ThreadLocalVariable`, since mlflow PR 13456 of October 2024; 2.10 has one
  global list, which its hook does end);
- against a tracking server that is gone, `end_run()` retries each HTTP call
  (MLFLOW_HTTP_REQUEST_MAX_RETRIES 7, backoff factor 2, 120 s timeout): the
  exit took 248 s here, and the run is RUNNING anyway.

We wrap `mlflow.start_run` (where `mlflow` and `mlflow.tracking.fluent` bind
it) and record each ActiveRun with the stack it was pushed on, so runs of any
thread, nested and resumed (`run_id=`) ones included, are seen. At exit (order
28, after TensorBoard writers: ending a run is one or two quick store calls, so
it comes before wandb's teardown, which can take seconds; and before any atexit
callback) each run still on its stack is taken off it first, so
mlflow's own hook and a tracker's later `end_run()` (verl and SkyRL end runs in
`__del__`) find nothing to end again, then ended with FINISHED, FAILED or KILLED
(see `_status`). A run the user ended is left alone: `end_run()` and `with`
take it off the stack; one ended through `MlflowClient.set_terminated` shows
a terminal status when we look it up.

Runs made by `MlflowClient.create_run` are not recorded: that low-level API
leaves ending the run to the caller, and handing the run id to another process
(MLFLOW_RUN_ID, a launcher, Ray Tune's trials) is an ordinary use; ending it
when the creating process exits would flip a run someone else still writes to.
Lightning's MLFlowLogger, the main user of create_run, ends its run itself.

Bounded: each run is ended in a helper thread we wait for until the step's
budget is nearly spent; mlflow's HTTP settings (retries, backoff, timeout) are
bounded by that budget for our thread only, through the `.get()` of mlflow's
own environment-variable objects, so the user's settings and calls are untouched.
A run that cannot be ended gets one warning line with its id.
"""

import sys
import time
import _thread
from _weakref import ref

from .. import engine, log, registry
from . import Patches, check_version, version_tuple

KIND = "mlflow"
ORDER = 28
SUPPORTED = "mlflow >= 2.10, < 4"  # tested: 2.10.2, 3.17.2 (the private names below)
MINIMUM, BELOW = "2.10", "4"
TERMINAL = ("FINISHED", "FAILED", "KILLED")
_patches = Patches()
_runs = {}      # id(ActiveRun) -> (weak ref to it, the stack it was pushed on, tracking URI)
_bounded = {}   # thread ident -> deadline, for the threads ending runs at exit
_env_patched = []  # mlflow environment-variable objects whose get() we bounded


def get_version():
    return getattr(sys.modules.get("mlflow"), "__version__", None)


def unsupported_reason():
    found = get_version()
    if found is None:  # not imported (doctor): ask the installed distributions;
        # mlflow-skinny provides the same `mlflow` package, without the server.
        return check_version("mlflow", MINIMUM, BELOW) or check_version("mlflow-skinny", MINIMUM, BELOW)
    # Imported: its own version, which costs nothing (the metadata look-ups cost 1-2 ms).
    if version_tuple(MINIMUM) <= version_tuple(found) < version_tuple(BELOW):
        return None
    return f"mlflow {found} is not supported (need >={MINIMUM},<{BELOW})"


def patch():
    if _patches:
        return
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is None:
        try:  # `import mlflow` imports it; a bare `import mlflow.tracking` may not have yet
            import mlflow.tracking.fluent as fluent
        except ImportError:
            return  # mlflow-tracing: no runs to end
    if not hasattr(fluent, "start_run"):
        return
    reason = unsupported_reason()
    if reason:
        log.warning_once("%s; mlflow runs are left to mlflow", reason, tree=True)
        return
    _patches.rebind(fluent.start_run, _record_run, "mlflow")  # mlflow and mlflow.tracking.fluent bind it
    engine.register_kind(KIND, ORDER, end_run, in_child=forget_in_child)
    engine.arm()
    # A run started before we were imported: take it from this thread's stack.
    stack = _stack()
    for run in list(stack or ()):
        _record(run, stack)
    log.debug("patched mlflow.start_run (mlflow %s)", get_version())


def unpatch():
    _patches.restore()
    while _env_patched:
        vars(_env_patched.pop()).pop("get", None)


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
    engine.arm()  # in a fork child that starts its own run


def forget_in_child(run):
    # mlflow 3.17 resets its per-thread stacks in a fork child; the parent's runs
    # are the parent's to end, so the child forgets them too.
    _runs.pop(id(run), None)


def _status():
    code, exception = engine.exit_code()
    if isinstance(exception, KeyboardInterrupt) or engine.exit_signal() is not None:
        return "KILLED"
    return "FINISHED" if code == 0 and exception is None else "FAILED"


def end_run(run, timeout):
    deadline = time.monotonic() + timeout
    entry = _runs.pop(id(run), None)
    if entry is None or entry[0]() is not run:
        return
    _, stack, uri = entry
    index = next((i for i, r in enumerate(stack) if r is run), None)
    if index is None:
        return  # ended by the user: end_run() or the end of a `with` block
    # Off the stack before any call that can hang, so that mlflow's atexit hook (and
    # a tracker's end_run() in __del__) cannot end it again, as FINISHED, later.
    # Nested runs still open above it go first, innermost first, as end_run() would.
    ending = stack[index:]
    del stack[index:]
    status = _status()
    for each in reversed(ending):
        _end_bounded(each.info.run_id, status, uri, deadline - 0.1)


def _end_bounded(run_id, status, uri, deadline):
    """End one run in a helper thread; give up on it at `deadline`, with one warning."""
    outcome = []
    done = _thread.allocate_lock()
    done.acquire()

    def target():
        _bounded[_thread.get_ident()] = deadline
        try:
            outcome.append(_end(run_id, status, uri))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            _bounded.pop(_thread.get_ident(), None)
            done.release()

    _bound_http()
    try:
        _thread.start_new_thread(target, ())
        done.acquire(timeout=max(0.0, deadline - time.monotonic()))
    except RuntimeError:  # no new threads during shutdown (Python 3.12.1): the engine's watchdog
        target()
    if not outcome:
        log.warning("mlflow run %s left RUNNING: %s did not answer within the deadline", run_id, uri)
    elif isinstance(outcome[0], BaseException):
        message = str(outcome[0]).strip().splitlines()
        log.warning("mlflow run %s left RUNNING: %s: %s", run_id, type(outcome[0]).__name__,
                    message[0][:200] if message else "")
    else:
        log.debug("mlflow run %s: %s", run_id, outcome[0])


def _end(run_id, status, uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    info = client.get_run(run_id).info
    if info.status in TERMINAL:
        return f"already {info.status}"  # the user ended it through the client
    if info.lifecycle_stage == "deleted":
        return "deleted"  # mlflow.delete_run(): the store refuses to update it
    client.set_terminated(run_id, status)
    fluent = sys.modules.get("mlflow.tracking.fluent")
    monitor = getattr(fluent, "run_id_to_system_metrics_monitor", {}).pop(run_id, None)
    if monitor is not None:  # log_system_metrics=True: what end_run() does after set_terminated
        monitor.finish()
    return f"ended {status}"


def _bound_http():
    """Bound mlflow's HTTP retries and timeouts by the deadline, in our threads only.

    mlflow reads these settings at each request (rest_utils.http_request), through
    `_EnvironmentVariable.get()`. Setting os.environ would change them for every
    thread; an instance attribute `get` that answers for our threads alone does not.
    Set once, the first time a run is ended; unpatch() takes it off."""
    env = sys.modules.get("mlflow.environment_variables")
    if env is None or _env_patched:
        return

    def left():
        return _bounded[_thread.get_ident()] - time.monotonic()

    # Three calls per run at most (our status look-up, set_terminated's run look-up
    # to print the run's URL, the update): each gets a third of the time left; one
    # immediate retry, for a connection the server dropped.
    bounds = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": lambda: 1 if left() > 1.0 else 0,
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": lambda: 0,
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": lambda: 0.0,
        "MLFLOW_HTTP_REQUEST_TIMEOUT": lambda: max(0.1, left() / 3),
        "MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER": lambda: False,
    }
    for name, bounded in bounds.items():
        variable = getattr(env, name, None)
        if variable is None or "get" in vars(variable):
            continue
        original = variable.get

        def get(original=original, bounded=bounded):
            if _thread.get_ident() in _bounded:
                return bounded()
            return original()

        variable.get = get
        _env_patched.append(variable)

