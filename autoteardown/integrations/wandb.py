"""wandb runs: finish each one with the process's true exit code, before wandb's own exit hook.

wandb (0.31) finishes runs from an atexit hook that its first `wandb.init`
registers when it starts wandb-core. That leaves gaps, each measured:
- SIGTERM with the default handler runs no hook: wandb-core is stopped without
  flushing and the run file keeps no records at all;
- a `finish()` at interpreter teardown (a tracker's `__del__`) blocks forever,
  since wandb's asyncio thread is a daemon and is frozen by then;
- a `finish()` in an atexit callback registered before the first run comes
  after wandb's teardown and prints ConnectionResetError tracebacks;
- a killed wandb-core turns wandb's hook into an "Exception ignored" traceback;
- `raise SystemExit(n)` bypasses wandb's `sys.exit` hook: the run records 0.

The engine runs us before any atexit callback. We finish every run this
process created (`reinit="create_new"` runs too; `wandb.run` holds only the
latest), then call `wandb.teardown()`, which unregisters wandb's atexit hook
and waits for wandb-core to write and exit. A later `finish()` is then a no-op.

The exit code is the engine's (`engine.ending()`: signals, the uncaught exception, sys.exit).
We leave `sys.excepthook` alone: wandb's prints the traceback and then calls
any hook that is not the default, so the user's traceback would print twice.
"""

import os
import sys

from .. import engine, log, registry
from . import Patches, check_version, installed_version

KIND = "wandb"
ORDER = 30
SUPPORTED = "wandb >= 0.22, < 0.32"  # tested: 0.22.3, 0.26.1, 0.30.0, 0.31.0 (the private names below)
_patches = Patches()


def get_version():
    return installed_version("wandb")


def unsupported_reason():
    return check_version("wandb", "0.22", "0.32")


def patch():
    if _patches:
        return
    reason = unsupported_reason()
    if reason:
        log.warning_once("%s; wandb runs are left to wandb", reason, tree=True)
        return
    from wandb.sdk import wandb_init

    # wandb, wandb.sdk and wandb.sdk.wandb_init bind the same `init` (0.22-0.31).
    _patches.rebind(wandb_init.init, _record_run, "wandb")
    engine.register_kind(KIND, ORDER, finish_run, after_all=teardown, in_child=forget_in_child)
    engine.arm()
    # Runs started before we were imported are not seen by the patched init:
    # take them from wandb's own list of unfinished runs.
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


def _record(run):
    # Only private attributes here: in a fork child, any public Run property
    # silently attaches the child to the parent's run (wandb 0.31 `_attach`).
    settings = getattr(run, "_settings", None)
    if getattr(settings, "_noop", False) or getattr(run, "_init_pid", None) != os.getpid():
        return  # WANDB_MODE=disabled, or the parent's run
    registry.record(KIND, run)
    engine.arm()  # in a fork child that starts its own run


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
    setup = _setup()
    service = getattr(getattr(setup, "_connection", None), "_proc", None)
    process = getattr(service, "_process", None)  # a subprocess.Popen
    return process.poll() if process is not None else None


def _exit_code():
    code, exception = engine.exit_code()
    # wandb's own excepthook records 255 for KeyboardInterrupt; keep its convention.
    return 255 if isinstance(exception, KeyboardInterrupt) else code


def finish_run(run, timeout):
    if getattr(run, "_is_finished", True) or _setup() is None:
        return  # finished by the user, or wandb.teardown() already closed it
    status = _core_status()
    if status is None:
        run.finish(exit_code=_exit_code())
        return
    run._console_stop()  # else wandb's console capture sends our warning to the dead socket
    _warn_core_ended(status)
    # Nothing can finish the run now, and a later finish() by the user or in a
    # `__del__` would raise or hang: make it a no-op.
    run._is_finished = True
    _setup().remove_active_run(run)


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
