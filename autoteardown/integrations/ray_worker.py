"""Inside a Ray actor: finalize while the actor's children still live.

Ray SIGKILLs an exiting actor's children (wandb-core, DataLoader workers) before its atexit runs,
and `ray.kill` runs no Python hook, so the actor finalizes where Ray tells it to end. One budget:
its creator kills it AUTOTEARDOWN_RAY_GRACE_S after asking; the teardown gets the grace minus a
second, and a watchdog ends the process just inside it.

- SIGTERM. Every handler Ray sets goes through `set_sigterm_handler`; ours, chained before it, only
  asks (`_ask`). A method running in the main thread is unwound by Ray's SystemExit and the teardown
  runs as it leaves the method executor; an idle actor tears down on a runner and gets the signal
  again for Ray's own exit.
- `ray.actor.exit_actor`, which `__ray_terminate__` looks up at call time.
- Ray Train v2's `RayTrainWorker.shutdown()` (then `ray.kill` after `patience_s`). The patch is a
  plain function with the original's __module__ and __qualname__ (`Patches.replace`): Ray pickles
  methods by reference, so each worker resolves its own (a wrapt proxy does not survive Ray's
  tracing injection).
"""

import faulthandler
import functools
import gc
import os
import signal
import sys
import threading
import time

from .. import cpython, deadlines, engine, forksafe, log, registry, signals, threads
from ..patches import Patches
from . import patches_of, ray_guard

SIGTERM_CODE = 128 + 15
ARMED = b"autoteardown-armed"  # the GCS KV namespace of the actors with something to tear down (armed_key)
STARTED = b"started"  # the value there of an actor that has started processes but recorded nothing
_main = threading.main_thread().ident


class _State:
    """This process's part in ending its actor. A fork child gets a new one, `forked` (see
    _after_fork_in_child): it has announced and torn down nothing, and never will."""

    def __init__(self, forked: bool = False) -> None:
        self.in_method = 0       # actor methods running in the main thread
        self.asked = False       # a SIGTERM asked this actor to end: its teardown is pending or under way
        self.stopped = False     # a SIGTERM came while something was recorded (ray_driver: end every actor at once)
        self.tearing = False     # the teardown has begun
        self.done = forked       # it has run: Ray's handler goes on as without us
        self.deferred = False    # Ray's abort after a SIGTERM waits for our teardown
        self.marked = False      # ray_guard.mark() was called (or this is no actor)
        self.started = forked    # this actor announced a process it started
        self.forked = forked     # a fork child: Ray's clients are not its own, and it is no actor


_state = _State()


def patch(patches: Patches) -> None:
    import ray._private.function_manager
    import ray._private.utils
    import ray.actor

    patches.wrap(ray.actor, "exit_actor", _on_actor_exit)
    patches.wrap(ray._private.utils, "set_sigterm_handler", _chain_sigterm_handler)
    patches.wrap(ray._private.function_manager.FunctionActorManager, "_make_actor_method_executor",
                 _on_make_executor)
    engine.when_armed(_on_armed)


def forked() -> bool:
    """Is this a fork child of an actor or a driver? Ray's clients are not its own (_after_fork_in_child)."""
    return _state.forked


def stopped() -> bool:
    """Did a SIGTERM come while something was recorded? (ray_driver then ends every actor at once.)"""
    return _state.stopped


def in_actor():
    if _state.forked:
        return False
    import ray

    worker = ray._private.worker.global_worker
    return worker.mode == ray.WORKER_MODE and not worker.actor_id.is_nil()


def armed_key(actor_id):
    """An actor's key in ARMED: its job's id first (an actor id's last 8 hex digits), so that one request
    removes all of a job's keys (ray_driver.unarm_job). ray_driver removes each when its actor ends."""
    return f"{actor_id[-8:]}:{actor_id}".encode()


def _announce(value=b""):
    """Tell GCS, in one quick request, that this actor has something to tear down: at the first
    record, or (STARTED, never over a record's) at the first process it starts, which its driver
    must end with it and cannot see on another node."""
    try:
        if in_actor():
            import ray

            worker = ray._private.worker.global_worker
            worker.gcs_client.internal_kv_put(armed_key(worker.actor_id.hex()), value, not value, ARMED, timeout=1)
    except Exception:
        log.debug_exception("could not announce this actor")


def _on_armed():
    """The first record: registered with the node's guard (ray_guard.py) and announced, off the caller's path."""
    threads.run_soon(lambda: (_watch(), _announce()))


def _watch():
    try:
        if in_actor():
            import ray

            ray_guard.watch(ray._private.worker.global_worker.actor_id.hex(), deadlines.grace())
    except Exception:
        log.debug_exception("could not register this actor with its guard")


def _on_process_started(wrapped, instance, args, kwargs):
    """subprocess.Popen and multiprocessing's start(), in an actor: the first registers the actor with its
    node's guard before it starts (it ends what this starts, however the actor ends) and is announced
    after; not the guard's own start, nor in the teardown, when the actor is ending already."""
    state = _state
    first = not state.started and not state.tearing and (kwargs.get("env") or {}).get(ray_guard.MARKER) != ray_guard.GUARD
    if first:
        _state.started = True
        _watch()
    result = wrapped(*args, **kwargs)
    if first:
        _announce(STARTED)
    return result


# ---- SIGTERM: the handler asks, the exit path tears down ------------------------

def _chain_sigterm_handler(wrapped, instance, args, kwargs):
    handler = args[0] if args else kwargs["sigterm_handler"]
    return wrapped(functools.partial(_ask, signals.chain(handler)))


def _ask(handler, signum, frame):
    if _state.done or not _state.asked and not registry.live():
        return handler(signum, frame)  # nothing of ours, or ours is done: Ray's way
    if _state.asked:
        if _state.in_method and not _state.tearing:
            return handler(signum, frame)  # the method's unwind was lost (a finalizer took it): again
        return  # another SIGTERM (a dying raylet's) while ours ends the actor: not into the teardown
    _defer_ray_abort()
    _state.stopped = True
    if not in_actor():
        # A driver: Ray's handler unwinds (sys.exit), and ray_driver ends the actors first. With
        # Ray's abort deferred, the end is ours to guarantee, even if that SystemExit is lost.
        signals.unwound_by_another(signum)
        return handler(signum, frame)
    _state.asked = True
    engine.on_sigterm(signum)  # not recorded: Ray's handler ends the process, not the engine
    if _state.in_method:
        return handler(signum, frame)  # Ray's SystemExit unwinds the method: run_method tears down
    if not threads.soon(lambda: threads.run_soon(_teardown_then_resend)):
        return handler(signum, frame)


def _defer_ray_abort():
    """Ray aborts the process 3 s after a SIGTERM (an alarm with no Python handler). With something
    to tear down, the abort waits for our teardown (AUTOTEARDOWN_TIMEOUT at most), and Ray's own
    shutdown then gets its 3 s (restore_ray_abort). An alarm with a Python handler is the user's."""
    if not _state.deferred and signal.getsignal(signal.SIGALRM) in (None, signal.SIG_DFL) and signal.alarm(0):
        _state.deferred = True
        signal.alarm(deadlines.ray_abort())


def restore_ray_abort():
    if _state.deferred:
        _state.deferred = False
        signal.alarm(deadlines.RAY_ABORT_S)


def _teardown_then_resend():
    until = time.monotonic() + 1.0
    while signals.main_thread_in(_ask.__code__) and time.monotonic() < until:
        time.sleep(0.005)  # the handler that asked has returned: no teardown inside it
    try:
        _teardown(interrupted=False)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # now Ray's handler ends the actor its own way


def _teardown(interrupted):
    """Once. The exit code: a Ray Train worker's function's; else 143 if the SIGTERM cut a method
    short, and the process's own (0) for an actor ended between two methods or by exit_actor."""
    if _state.tearing:
        return
    _state.tearing = True
    ray_guard.due(deadlines.actor_due(time.time()))  # a backup to the watch of whoever ended it, if any
    code = train_exit_code()
    code = SIGTERM_CODE if code is None and interrupted else code
    try:
        threads.alarm(time.monotonic() + deadlines.actor_watchdog(), _overdue)  # before anything can hang
        engine.finalize(deadlines.actor_teardown(), exit_code=code)
        gc.collect()
    finally:
        _state.done = True
        restore_ray_abort()


def _overdue():
    """A hung finalizer or __del__ (gc.collect(), interpreter teardown): its stack to the log, then out."""
    faulthandler.dump_traceback(all_threads=True)
    signals.end_process(code=1)


def _on_make_executor(wrapped, instance, args, kwargs):
    executor = wrapped(*args, **kwargs)

    def run_method(*method_args, **method_kwargs):
        if not _state.marked:
            _mark()
        main = threading.get_ident() == _main
        _state.in_method += main
        try:
            return executor(*method_args, **method_kwargs)
        except BaseException:
            if main and _state.asked:
                _teardown(interrupted=True)  # unwound by Ray's SystemExit: the method is over, its children live
            raise
        finally:
            _state.in_method -= main

    run_method.name, run_method.method = executor.name, executor.method  # Ray reads them
    return run_method


def _mark():
    """Before the actor's first method (its __init__): what it starts carries its id (ray_guard.py),
    and its first process registers it with its guard."""
    _state.marked = True
    try:
        if in_actor():
            import multiprocessing.process
            import subprocess

            import ray

            ray_guard.mark(ray._private.worker.global_worker.actor_id.hex())
            patches = patches_of("ray")
            if patches is not None:
                patches.wrap(subprocess.Popen, "__init__", _on_process_started)
                patches.wrap(multiprocessing.process.BaseProcess, "start", _on_process_started)
    except Exception:
        log.debug_exception("could not mark this actor's environment")


def _on_actor_exit(wrapped, instance, args, kwargs):
    try:
        if in_actor():
            _teardown(interrupted=False)
    except Exception:
        log.debug_exception("in-band finalize at exit_actor failed")
    return wrapped(*args, **kwargs)


def _after_fork_in_child():
    """Ray's clients belong to the process that made them: a fork child never uses them. A GCS request
    through the parent's client is never answered, and its timeout does not apply: the child would wait
    forever (a DataLoader worker's first subprocess, announced). So a fork child (of an actor or a driver)
    is `forked`, which every Ray call of ours checks: it is no actor (in_actor() is False: it announces
    nothing, hands no ending on), removes no key (ray_driver), none of its parent's state (announced,
    asked, tearing down) is its own, and a SIGTERM handler of Ray's it inherited goes on as without us."""
    global _state
    _state = _State(forked=True)
    ray_guard.after_fork_in_child()


forksafe.register(__name__, _after_fork_in_child)


# ---- Ray Train v2 -------------------------------------------------------------

class TrainingStopped(SystemExit):
    """Raised into a Ray Train training thread that runs on while its worker shuts down."""


def patch_train_worker(module, patches: Patches) -> None:
    # A plain function, pickled by reference: see the module docstring.
    patches.replace(module.RayTrainWorker, "shutdown", _finalizing_after)


def _finalizing_after(original):
    @functools.wraps(original)
    def shutdown(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            _finalize_train_worker()

    return shutdown


def patch_train_runner(module, patches: Patches) -> None:
    patches.wrap(module, "construct_user_exception_with_traceback", _unless_stopped)


def _unless_stopped(wrapped, instance, args, kwargs):
    """The training function's error, logged by Ray Train: not when we stopped it."""
    exc = args[0] if args else kwargs.get("e")
    if isinstance(exc, TrainingStopped):
        from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

        return UserExceptionWithTraceback(exc, traceback_str="")
    return wrapped(*args, **kwargs)


def _finalize_train_worker():
    """A training function still running (another rank failed, the group is shutting down) is stopped first:
    resources torn down under it would make it raise, and Ray Train would log this rank as failed.
    TrainingStopped is raised at its next bytecode (a SystemExit: its `finally` blocks run)."""
    try:
        if not in_actor():
            return
        code, budget = train_exit_code(), deadlines.actor_teardown(_train_patience())
        thread = getattr(_train_runner(), "_thread", None)
        if code == SIGTERM_CODE and thread is not None and thread.is_alive():
            budget /= 2  # half to stop it, half to finalize
            cpython.raise_in_thread(thread.ident, TrainingStopped)
            thread.join(budget)
        log.debug("Ray Train worker %d: finalizing in-band (exit code %s, %.1fs, training thread %s)", os.getpid(),
                  code, budget, "running" if thread is not None and thread.is_alive() else "ended")
        engine.finalize(budget, exit_code=code)
    except Exception:
        log.debug_exception("Ray Train worker: in-band finalize failed")


def _train_runner():
    module = sys.modules.get("ray.train.v2._internal.execution.context")
    try:
        return module.get_train_context().execution_context.training_thread_runner
    except Exception:
        return None


def _train_patience():
    """Ray Train's wait between asking the workers to shut down and killing them."""
    try:
        import inspect

        from ray.train.v2._internal.execution.worker_group import state

        return float(inspect.signature(state._shutdown_workers).parameters["patience_s"].default)
    except Exception:
        return 5.0  # ray 2.60's


def train_exit_code():
    """0 if the training function returned, 1 if it raised, 143 if it still runs; None outside Ray Train."""
    runner = _train_runner()
    if runner is None:
        return None
    if runner.is_running():
        return SIGTERM_CODE
    error = getattr(runner.get_error(), "_base_exc", runner.get_error())  # Ray Train wraps it
    if error is None:
        return 0
    return SIGTERM_CODE if isinstance(error, TrainingStopped) else 1
