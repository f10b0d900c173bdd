"""wandb runs: finish each one with the process's exit code, before wandb's own exit hook.

Every run this process created is finished (`wandb.run` holds only the latest), then wandb's own
exit hook is run: its service connection's teardown takes that hook off and waits for wandb-core
to write out and stop. Not `sys.excepthook`: wandb's calls a non-default one after printing, so
tracebacks would print twice.

A run whose finish is still waiting for the server when its budget is over (a server that
stalls or is gone) has its data, exit record included, in its local run file: it is taken off
wandb's active runs, so that `wandb.teardown()` does not finish it a second time, and one line
says how to upload it later (`wandb sync --include-online <dir>`).

A finish() the script calls itself (run.finish(), wandb.finish(), the end of a `with wandb.init()`
block) is bounded by the same rule, wherever it is in the script: it waits while the upload
moves, and is let go once wandb-core's operations have not changed (none began or ended, no
progress moved) for AUTOTEARDOWN_TIMEOUT seconds. The run is complete on disk by then
(wandb-core writes each record before it sends it), so the line above is printed and the script
goes on. A slow upload that moves is never cut; a run whose own `finish_timeout` is set, an
offline run, and a wandb whose progress cannot be read are left to wandb.
"""

import os
import sys
import threading
import time
import weakref

from .. import deadlines, exitstatus, log, registry, signals, threads
from ..patches import Patches
from . import kind_of, recording

KIND = kind_of(__name__)  # the private names below: tested on 0.22.0 and 0.31
_finishing: "weakref.WeakSet" = weakref.WeakSet()  # runs whose finish() the teardown started, until it returns
_let_go: "weakref.WeakSet" = weakref.WeakSet()  # runs whose finish() the script called, let go (see above)


def patch(patches: Patches) -> None:
    from wandb.sdk import wandb_init, wandb_run

    # wandb, wandb.sdk and wandb.sdk.wandb_init bind the same `init` (0.22-0.31).
    patches.rebind(wandb_init.init, recording(_record), "wandb")
    patches.wrap(wandb_run.Run, "__exit__", signals.exit_unless_stopped)
    patches.wrap(wandb_run.Run, "_finish", _bounded_finish)  # finish(), wandb.finish() and __exit__ call it
    setup = _setup()  # runs started before we were imported
    if setup is not None:
        with setup._active_runs_lock:
            runs = list(setup._active_runs)
        for run in runs:
            _record(run)


def _record(run):
    # Private attributes only: in a fork child, public Run properties attach to the parent's run.
    settings = getattr(run, "_settings", None)
    if getattr(settings, "_noop", False) or getattr(run, "_init_pid", None) != os.getpid():
        return  # WANDB_MODE=disabled, or the parent's run
    registry.record(KIND, run)


def _setup():
    """wandb's per-process singleton, or None (it is stale in a fork child)."""
    setup = getattr(sys.modules.get("wandb.sdk.wandb_setup"), "_singleton", None)
    return setup if setup is not None and setup._pid == os.getpid() else None


def _core_status():
    """wandb-core's exit status if this process started it and it has died, else None."""
    service = getattr(getattr(_setup(), "_connection", None), "_proc", None)
    process = getattr(service, "_process", None)  # a subprocess.Popen
    return process.poll() if process is not None else None


def _bounded_finish(wrapped, run, args, kwargs):
    """The script's own finish(), in a runner, waited for while wandb-core's operations progress."""
    settings = getattr(run, "_settings", None)
    # A fork child never talks to the parent's wandb-core (_init_pid).
    seen = None if run in _finishing or getattr(run, "_is_finished", True) or getattr(settings, "_offline", True) \
        or getattr(settings, "finish_timeout", 0) or getattr(run, "_init_pid", None) != os.getpid() else _progress(run)
    if seen is None:
        return wrapped(*args, **kwargs)
    outcome = []
    done = threading.Event()

    def finish() -> None:
        try:
            outcome.append((wrapped(*args, **kwargs), None))
        except BaseException as exc:  # raised again in the caller
            outcome.append((None, exc))
        finally:
            done.set()

    if not threads.submit(finish):
        return wrapped(*args, **kwargs)
    moved = time.monotonic()
    while not done.wait(0.5):
        now = _progress(run)
        if now is not None and seen is not None and now != seen:
            moved = time.monotonic()
        seen = now
        if time.monotonic() - moved >= deadlines.stalled_after():
            _let_go.add(run)
            from wandb.sdk.lib import module

            if sys.modules["wandb"].run is run:
                module.unset_globals()  # as the finish would have, when it returns
            _warn_not_uploaded(run)
            return None
    result, exc = outcome[0]
    if exc is not None:
        raise exc
    return result


def _progress(run) -> "dict | None":
    """wandb-core's operations under way, {description: progress}; None if they cannot be read."""
    try:
        from wandb.proto import wandb_internal_pb2 as pb

        interface = getattr(run, "_interface", None) or run._backend.interface  # 0.31, 0.22
        handle = interface._deliver(pb.Record(request=pb.Request(operations=pb.OperationStatsRequest())))
        stats = handle.wait_or(timeout=1.0).response.operations_response.operation_stats
        return {f"{op.desc}/{sub.desc}": sub.progress for op in stats.operations for sub in op.subtasks} | {
            op.desc: op.progress for op in stats.operations}
    except Exception:
        return None


def _warn_not_uploaded(run) -> None:
    directory = getattr(getattr(run, "_settings", None), "sync_dir", None) or "the run's folder"
    log.warning("%s: not uploaded (W&B did not answer); it is complete on disk: upload it later with "
                "`wandb sync --include-online %s`", describe(run), directory)


def _exit_code():
    code, exception, _ = exitstatus.ending()
    # wandb's own excepthook records 255 for KeyboardInterrupt; keep its convention.
    return 255 if isinstance(exception, KeyboardInterrupt) else code


def finalize_one(run, timeout: float) -> "str | None":
    """Finish the run with the process's exit code."""
    if getattr(run, "_is_finished", True) or _setup() is None:
        return None  # finished by the user, or wandb was torn down (after_all)
    status = _core_status()
    if status is None:
        _finishing.add(run)
        run.finish(exit_code=_exit_code())
        _finishing.discard(run)
        return None
    run._console_stop()  # else wandb's console capture sends our warning to the dead socket
    _warn_core_ended(status)
    # Nothing can finish it now; a later finish() would raise or hang: make it a no-op.
    run._is_finished = True
    _setup().remove_active_run(run)
    return "wandb-core gone"


def after_all(timeout: float) -> "str | None":
    """wandb's own exit hook, run now: the service connection's teardown, in which wandb-core writes
    out and stops and that hook is taken off; this process's wandb is then torn down, as after
    `wandb.teardown()`. Not `wandb.teardown()` itself: it also joins wandb's asyncio thread, which
    wandb's exit never does (a daemon thread), and that join never returns once an exception
    raised into the main thread while wandb scheduled a task (a signal handler's SystemExit during
    a console write) left the task counted but never run.
    After a finish let go, "left behind": what waits on the server (wandb's telemetry exit hook,
    up to its 10 s request) is cut as after a step left behind (engine.py)."""
    setup = _setup()
    if setup is None:
        return None  # torn down already
    for run in list(_finishing):  # left behind: the server did not answer
        _finishing.discard(run)
        setup.remove_active_run(run)
        _warn_not_uploaded(run)
    core_died = _core_status() is not None
    from wandb.sdk import wandb_setup

    with wandb_setup._singleton_lock:
        if wandb_setup._singleton is setup:
            wandb_setup._singleton = None
    connection = getattr(setup, "_connection", None)
    if connection is None or getattr(connection, "_torn_down", False):
        return "left behind" if _let_go else None
    try:
        status = connection.teardown(_exit_code())
    except Exception:
        if not core_died:
            raise
        # With wandb-core gone it raises, after unregistering wandb's hook: what we need.
        log.debug_exception("wandb's teardown with wandb-core gone")
    else:
        if status not in (None, 0):
            _warn_core_ended(status)
    return "left behind" if _let_go else None


def _warn_core_ended(status):
    log.warning_once("wandb-core ended early (%s): the run data it had not yet written is lost",
                     f"signal {-status}" if status < 0 else f"status {status}")


def in_child(run) -> None:
    # The child's copy of wandb's exit hook can only fail (ForkedError): unregister it.
    setup = getattr(sys.modules.get("wandb.sdk.wandb_setup"), "_singleton", None)
    cleanup = getattr(getattr(setup, "_connection", None), "_cleanup", None)
    if cleanup is not None and getattr(setup, "_pid", None) != os.getpid():
        cleanup()


def describe(run) -> str:
    settings = getattr(run, "_settings", None)
    run_id = getattr(run, "_run_id", None) or getattr(settings, "run_id", None)
    name, project = getattr(settings, "run_name", None), getattr(settings, "project", None)
    return (f"run {run_id}" if run_id else "run") + (f" ({name!s})" if name else "") + (
        f" in project {project}" if project else "")
