"""Inside a Ray actor: finalize in-band, before Ray kills the actor's children.

When an actor exits, Ray SIGKILLs its children (wandb-core, DataLoader workers)
before the actor's atexit runs; `ray.kill` quick-exits the process with no
Python hook at all. So the actor's resources are finalized while it is still
healthy, at the points where Ray tells it to end:
- `ray.actor.exit_actor`, which `__ray_terminate__` looks up at call time;
- the worker's SIGTERM handler, which calls the module global
  `ray._private.worker.raise_sys_exit_with_custom_error_message` (2.40 to 2.60);
- Ray Train v2's `RayTrainWorker.shutdown()`: its worker group ends with
  `actor.shutdown.remote()`, `ray.wait(..., timeout=5)`, then always
  `ray.kill` (train/v2/_internal/execution/worker_group/state.py, ray 2.60);
- `__ray_call__(finalize_in_actor)` from the process that created the actor,
  when it exits or calls `ray.shutdown()` (see ray_driver.py).

One budget: after `__ray_terminate__` the creator's reaper kills the process
AUTOTEARDOWN_RAY_GRACE_S after the request, so the in-band finalize gets the
grace minus a second (and at most AUTOTEARDOWN_TIMEOUT), and a watchdog armed
*before* it ends the process just inside the grace: a finalizer or a `__del__`
in gc.collect() or interpreter teardown that hangs cannot outlive it.

Nothing here needs wrapt: RayTrainWorker.shutdown is replaced by a plain
function that keeps the original's __module__ and __qualname__. Ray pickles the
actor class in the creating process (Ray Train's controller) and its methods
by reference, so each worker resolves `RayTrainWorker.shutdown` in its own
module: ours where the worker has the shim, Ray's own where it does not. (A
wrapt proxy in the creating process does not survive Ray's tracing injection,
which copies the methods onto the actor class it ships.)
"""

import functools
import os
import sys

from .. import config, engine, log

TRAIN_V2_WORKER = "ray.train.v2._internal.execution.worker_group.worker"
_train_original = None   # RayTrainWorker.shutdown before we replaced it
SIGTERM_CODE = 128 + 15


def patch(patches):
    import ray._private.worker
    import ray.actor

    patches.wrap(ray.actor, "exit_actor", _on_actor_exit)
    patches.wrap(ray._private.worker, "raise_sys_exit_with_custom_error_message", _on_worker_sigterm)
    from .. import importhook

    importhook.register(TRAIN_V2_WORKER, "autoteardown.integrations.ray_worker:patch_train_worker")


def unpatch():
    global _train_original
    module = sys.modules.get(TRAIN_V2_WORKER)
    worker_class = getattr(module, "RayTrainWorker", None)
    if _train_original is not None and getattr(worker_class, "shutdown", None) is not _train_original:
        if getattr(worker_class.shutdown, "__wrapped__", None) is _train_original:
            worker_class.shutdown = _train_original
    _train_original = None


def _in_actor():
    import ray

    worker = ray._private.worker.global_worker
    return worker.mode == ray.WORKER_MODE and not worker.actor_id.is_nil()


def _on_actor_exit(wrapped, instance, args, kwargs):
    try:
        if _in_actor():
            finalize_in_band(config.RAY_GRACE, train_exit_code())
    except Exception:
        log.debug_exception("in-band finalize at exit_actor failed")
    return wrapped(*args, **kwargs)


def _on_worker_sigterm(wrapped, instance, args, kwargs):
    try:
        finalize_in_band(config.RAY_GRACE, train_exit_code())
    except Exception:
        log.debug_exception("in-band finalize at SIGTERM failed")
    return wrapped(*args, **kwargs)


def _budget(patience):
    """The in-band teardown's share of what Ray waits before it kills the worker."""
    return min(config.TIMEOUT, max(0.5, patience - 1.0))


def finalize_in_band(grace, exit_code=None):
    """Finalize while the worker and its children are still healthy, within
    the grace the reaper allows, and make sure the process ends inside it."""
    import faulthandler
    import gc
    import time

    from .. import signals

    def overdue():  # a hung finalizer or __del__ (in gc.collect() or interpreter teardown)
        faulthandler.dump_traceback(all_threads=True)  # its stack in the worker's log
        signals.end_process(code=1)

    signals.alarm(time.monotonic() + max(0.5, grace - 0.25), overdue)  # first: armed before anything can hang
    engine.finalize(_budget(grace), exit_code=exit_code)
    gc.collect()


def finalize_requested(timeout, exit_code=None):
    """What the creator's `__ray_call__` runs in the actor (at its exit or
    ray.shutdown()): a Ray Train worker hands on its training function's outcome."""
    code = train_exit_code()
    engine.finalize(timeout, exit_code=code if code is not None else exit_code)


# ---- Ray Train v2 -------------------------------------------------------------

def patch_train_worker():
    global _train_original
    module = sys.modules[TRAIN_V2_WORKER]
    worker_class = module.RayTrainWorker
    original = vars(worker_class).get("shutdown")
    if original is None or _train_original is not None:
        return

    # Not through Patches: a plain function with the same __module__/__qualname__ is
    # pickled by reference (see above); a wrapt proxy is not.
    @functools.wraps(original)
    def shutdown(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            _finalize_train_worker()

    _train_original = original
    worker_class.shutdown = shutdown
    log.debug("patched RayTrainWorker.shutdown")


def _finalize_train_worker():
    try:
        if not _in_actor():
            return
        patience = _train_patience()
        code = train_exit_code()
        log.debug("Ray Train worker %d: finalizing in-band (exit code %s, patience %.1fs)", os.getpid(), code, patience)
        engine.finalize(_budget(patience), exit_code=code)
    except Exception:
        log.debug_exception("Ray Train worker: in-band finalize failed")


def _train_patience():
    """Ray Train's wait between asking the workers to shut down and killing them."""
    try:
        import inspect

        from ray.train.v2._internal.execution.worker_group import state

        return float(inspect.signature(state._shutdown_workers).parameters["patience_s"].default)
    except Exception:
        return 5.0  # ray 2.60's


def train_exit_code():
    """0 if the training function returned, 1 if it raised, 143 if it is still
    running (the worker is being stopped from outside); None outside Ray Train."""
    module = sys.modules.get("ray.train.v2._internal.execution.context")
    if module is None:
        return None
    try:
        runner = module.get_train_context().execution_context.training_thread_runner
    except Exception:
        return None
    if runner.is_running():
        return SIGTERM_CODE
    return 1 if runner.get_error() is not None else 0
