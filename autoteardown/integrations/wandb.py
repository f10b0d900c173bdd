"""wandb runs: finish each one with the process's true exit code, before wandb's own exit hook.

wandb finishes runs from an atexit hook that its first `wandb.init` registers when
it starts wandb-core (README "wandb runs" lists what that leaves out, measured). The
engine runs us before any atexit callback: we finish every run this process created
(`reinit="create_new"` runs too; `wandb.run` holds only the latest), then call
`wandb.teardown()`, which unregisters wandb's atexit hook and waits for wandb-core to
write and exit. A later `finish()` is then a no-op.

The exit code is the engine's (`engine.ending()`). We leave `sys.excepthook` alone:
wandb's prints the traceback and then calls any hook that is not the default, so the
user's traceback would print twice. `Run.__exit__` does not see our SIGTERM unwind: it
would print it as a traceback and record exit code 1; the teardown records 143.
"""

import os
import sys

from .. import engine, log, registry
from . import Patches, get_version as _version, supported

NAME = KIND = "wandb"
ORDER = 30  # the private names below: tested on 0.22.0 and 0.31
_patches = Patches()


def get_version():
    return _version(NAME)


def patch():
    if _patches or not supported(NAME):
        return
    from wandb.sdk import wandb_init, wandb_run

    # wandb, wandb.sdk and wandb.sdk.wandb_init bind the same `init` (0.22-0.31).
    _patches.rebind(wandb_init.init, _record_run, "wandb")
    _patches.wrap(wandb_run.Run, "__exit__", _exit_unless_stopped)
    engine.register_kind(KIND, ORDER, finish_run, after_all=teardown, in_child=forget_in_child)
    # Runs started before we were imported are not seen by the patched init.
    for run in _active_runs():
        _record(run)


def unpatch():
    _patches.restore()


def _record_run(wrapped, instance, args, kwargs):
    run = wrapped(*args, **kwargs)
    try:
        _record(run)
    except Exception:
        log.debug_exception("could not record wandb run %r", run)
    return run


def _exit_unless_stopped(wrapped, instance, args, kwargs):
    if engine.is_stop(args[1] if len(args) > 1 else kwargs.get("exc_val")):
        return False  # the teardown finishes the run, with the signal's code
    return wrapped(*args, **kwargs)


def _record(run):
    # Only private attributes here: in a fork child, any public Run property
    # silently attaches the child to the parent's run (wandb 0.31 `_attach`).
    settings = getattr(run, "_settings", None)
    if getattr(settings, "_noop", False) or getattr(run, "_init_pid", None) != os.getpid():
        return  # WANDB_MODE=disabled, or the parent's run
    registry.record(KIND, run)


def _setup():
    """wandb's per-process singleton, or None (it is stale in a fork child)."""
    setup = getattr(sys.modules.get("wandb.sdk.wandb_setup"), "_singleton", None)
    return setup if setup is not None and setup._pid == os.getpid() else None


def _active_runs():
    setup = _setup()
    if setup is None:
        return []
    with setup._active_runs_lock:
        return list(setup._active_runs)


def _core_status():
    """wandb-core's exit status if this process started it and it has died, else None."""
    service = getattr(getattr(_setup(), "_connection", None), "_proc", None)
    process = getattr(service, "_process", None)  # a subprocess.Popen
    return process.poll() if process is not None else None


def _exit_code():
    code, exception, _ = engine.ending()
    # wandb's own excepthook records 255 for KeyboardInterrupt; keep its convention.
    return 255 if isinstance(exception, KeyboardInterrupt) else code


def finish_run(run, timeout):
    if getattr(run, "_is_finished", True) or _setup() is None:
        return None  # finished by the user, or wandb.teardown() closed it
    status = _core_status()
    if status is None:
        run.finish(exit_code=_exit_code())
        return None
    run._console_stop()  # else wandb's console capture sends our warning to the dead socket
    _warn_core_ended(status)
    # Nothing can finish the run now, and a later finish() by the user or in a
    # `__del__` would raise or hang: make it a no-op.
    run._is_finished = True
    _setup().remove_active_run(run)
    return "wandb-core gone"


def teardown(timeout):
    if _setup() is None:
        return  # torn down already
    core_died = _core_status() is not None
    import wandb

    try:
        wandb.teardown(exit_code=_exit_code())
    except SystemExit as exc:
        # wandb.teardown() calls sys.exit() with wandb-core's status when it is not 0
        # (0.31; 0.22 too once it has died): one line for it, the same as finish_run's.
        _warn_core_ended(exc.code if isinstance(exc.code, int) else 1)
    except Exception:
        if not core_died:
            raise
        # It raises ConnectionResetError once wandb-core is gone, but only after
        # unregistering wandb's atexit hook, which is what we need from it.
        log.debug_exception("wandb.teardown() with wandb-core gone")


def _warn_core_ended(status):
    log.warning_once("wandb-core ended early (%s): the run data it had not yet written is lost",
                     f"signal {-status}" if status < 0 else f"status {status}")


def forget_in_child(run):
    # The child inherits wandb's atexit hook for the parent's wandb-core; at the
    # child's exit it can only fail (ForkedError, "Exception ignored in atexit
    # callback"). Unregister it: the connection is the parent's.
    setup = getattr(sys.modules.get("wandb.sdk.wandb_setup"), "_singleton", None)
    cleanup = getattr(getattr(setup, "_connection", None), "_cleanup", None)
    if cleanup is not None and getattr(setup, "_pid", None) != os.getpid():
        cleanup()


def describe(run):
    # Private attributes only: in a fork child the public properties talk to the parent's run.
    settings = getattr(run, "_settings", None)
    run_id = getattr(run, "_run_id", None) or getattr(settings, "run_id", None)
    name, project = getattr(settings, "run_name", None), getattr(settings, "project", None)
    return (f"run {run_id}" if run_id else "run") + (f" ({name!s})" if name else "") + (
        f" in project {project}" if project else "")
