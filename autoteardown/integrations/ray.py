"""Ray actors: an actor told to end really ends, and what it held is finalized first.

Facts this module is built on (ray 2.60):
- Every actor method call, `__ray_terminate__` included (with or without
  `.options()`), goes through `ActorHandle._actor_method_call(method_name, ...)`;
  the handle has no `__ray_terminate__` attribute of its own.
- After `__ray_terminate__` GCS marks the actor DEAD at once. If its interpreter
  teardown then hangs, the process lives on with its memory and `ray.kill` is a
  silent no-op. So the process that sent the request watches the pid and kills it
  after a grace period (by pid here, through a zero-CPU task on another node).
- When an actor exits, Ray SIGKILLs its children (wandb-core, DataLoader workers)
  before the actor's atexit runs; when the driver exits, its actors are
  force-killed with no atexit at all. So an actor's resources are finalized
  in-band: in `ray.actor.exit_actor` (which `__ray_terminate__` looks up at call
  time), in the worker's SIGTERM path, and, when the driver exits or calls
  `ray.shutdown()`, through `__ray_call__` sent by the driver.
"""

import os
import sys
import threading
import time

from .. import config, engine, log, registry
from . import Patches, check_version

KIND = "ray"
ORDER = 20
SUPPORTED = "ray >= 2.40"
_patches = Patches()
_watched = set()    # _Terminated objects, kept alive until reaped


def get_version():
    return getattr(sys.modules.get("ray"), "__version__", None)


def unsupported_reason():
    return check_version("ray", "2.40")


def patch():
    reason = unsupported_reason()
    if reason:
        log.warning_once("%s; Ray actors are left alone", reason)
        return
    import ray
    import ray._private.worker
    import ray.actor

    engine.register_kind(KIND, ORDER, finalize_one)
    _patches.wrap(ray.actor.ActorHandle, "_actor_method_call", _on_actor_method_call)
    _patches.wrap(ray.actor.ActorClass, "_remote", _on_actor_created)
    _patches.wrap(ray.actor, "exit_actor", _on_actor_exit)
    # The worker's SIGTERM handler (Worker.main_loop) calls this module global.
    _patches.wrap(ray._private.worker, "raise_sys_exit_with_custom_error_message", _on_worker_sigterm)
    _patches.wrap(ray, "shutdown", _on_shutdown)
    engine.arm()


def unpatch():
    _patches.restore()


# ---- driver side (any process that holds actor handles) -----------------------

def _on_actor_created(wrapped, instance, args, kwargs):
    handle = wrapped(*args, **kwargs)
    try:
        if kwargs.get("lifetime") != "detached":  # a detached actor outlives us on purpose
            registry.record(KIND, handle)
    except Exception:
        log.debug_exception("could not record an actor handle")
    return handle


def _on_actor_method_call(wrapped, instance, args, kwargs):
    method_name = args[0] if args else kwargs.get("method_name")
    if method_name != "__ray_terminate__":
        return wrapped(*args, **kwargs)
    terminated = None
    try:  # look the process up before the request goes out: GCS forgets nothing, but the actor is DEAD at once
        terminated = _Terminated.lookup(instance)
    except Exception:
        log.debug_exception("could not look up the actor being terminated")
    result = wrapped(*args, **kwargs)
    if terminated is not None:
        terminated.watch()
    return result


def _on_shutdown(wrapped, instance, args, kwargs):
    engine.finalize(kinds=(KIND,))
    return wrapped(*args, **kwargs)


def finalize_one(obj, timeout):
    if isinstance(obj, _Terminated):
        obj.reap_when_due(timeout)
    else:
        _ask_actor_to_finalize(obj, timeout)


def _ask_actor_to_finalize(handle, timeout):
    """Have a live actor finalize its own resources before Ray force-kills it."""
    import ray

    if not ray.is_initialized():
        return
    try:
        ref = handle.__ray_call__.remote(_finalize_in_actor, max(0.1, timeout - 0.5))
        done = ray.get(ref, timeout=timeout)
        log.debug("actor %s finalized in-band: %s", handle._ray_actor_id.hex()[:8], done)
    except ray.exceptions.GetTimeoutError:
        log.warning("actor %s did not finalize within %.1fs", handle._ray_actor_id.hex()[:8], timeout)
    except ray.exceptions.RayError as exc:  # dead already, or could not run it
        log.debug("actor %s not finalized: %s", handle._ray_actor_id.hex()[:8], type(exc).__name__)


def _make_finalize_in_actor():
    # Defined inside a function so that cloudpickle sends it by value: the actor
    # needs no autoteardown to run it, and does nothing if the shim is not there.
    def finalize_in_actor(actor, timeout):
        shim = sys.modules.get("autoteardown")
        if shim is None:
            return False
        shim.finalize(timeout)
        return True

    return finalize_in_actor


_finalize_in_actor = _make_finalize_in_actor()


class _Terminated:
    """An actor told to end, watched until its process is really gone."""

    def __init__(self, actor_id, pid, node_id, requested_at):
        self.actor_id, self.pid, self.node_id = actor_id, pid, node_id
        self.requested_at = requested_at
        self.due = time.monotonic() + config.RAY_GRACE
        self._lock = threading.Lock()
        self._done = False

    @classmethod
    def lookup(cls, handle):
        import ray._private.state

        actor_id = handle._ray_actor_id.hex()
        info = ray._private.state.actors(actor_id) or {}
        pid = info.get("Pid") or 0
        if info.get("State") != "ALIVE" or pid <= 0:
            return None
        registry.forget(handle)  # it will not be asked to finalize: it is ending
        return cls(actor_id, pid, info.get("Address", {}).get("NodeID"), time.time())

    def watch(self):
        _watched.add(self)
        registry.record(KIND, self)
        timer = threading.Timer(max(0.0, self.due - time.monotonic()), self.reap)
        timer.daemon = True
        timer.start()

    def reap_when_due(self, timeout):
        """At exit: wait for the grace period (as far as the budget allows), then reap.
        An actor on this node that is already gone ends the wait at once."""
        until = min(self.due, time.monotonic() + max(0.0, timeout - 1.0))
        while time.monotonic() < until and not (self._is_local() and self._gone_here()):
            time.sleep(0.05)
        self.reap()

    def _is_local(self):
        import ray

        return self.node_id is None or self.node_id == ray.get_runtime_context().get_node_id()

    def _gone_here(self):
        import psutil

        try:
            return psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def reap(self):
        with self._lock:
            if self._done:
                return
            self._done = True
        _watched.discard(self)
        registry.forget(self)
        try:
            import ray

            if self._is_local():
                killed = _kill_if_same_process(self.pid, self.requested_at)
            else:
                killed = ray.get(_remote_kill_on(self.node_id).remote(self.pid, self.requested_at), timeout=10)
            if killed:
                log.debug("killed actor %s (pid %d): still alive %.1fs after __ray_terminate__",
                          self.actor_id[:8], self.pid, time.time() - self.requested_at)
        except Exception:
            log.debug_exception("reaping actor %s failed", self.actor_id[:8])


def _make_kill_if_same_process():
    # By value (see above): it also runs in a zero-CPU task on the actor's node.
    def kill_if_same_process(pid, not_after):
        """SIGKILL `pid` if it is still the Ray worker that existed at `not_after`."""
        import os
        import signal

        import psutil

        try:
            process = psutil.Process(pid)
            # A reused pid belongs to a process created after the request.
            if process.create_time() > not_after:
                return False
            command = " ".join(process.cmdline())
            if "ray::" not in command and "default_worker.py" not in command:
                return False
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            os.kill(pid, signal.SIGKILL)
            return True
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            return False

    return kill_if_same_process


_kill_if_same_process = _make_kill_if_same_process()


def _remote_kill_on(node_id):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_kill_if_same_process)
    return task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))


# ---- worker side (the shim running inside an actor) ----------------------------

def _on_actor_exit(wrapped, instance, args, kwargs):
    import ray

    worker = ray._private.worker.global_worker
    if worker.mode == ray.WORKER_MODE and not worker.actor_id.is_nil():
        _finalize_in_band()
    return wrapped(*args, **kwargs)


def _on_worker_sigterm(wrapped, instance, args, kwargs):
    _finalize_in_band()
    return wrapped(*args, **kwargs)


def _finalize_in_band():
    """Finalize while the worker and its children are still healthy, then make
    sure interpreter teardown cannot outlive the grace period."""
    import faulthandler
    import gc

    engine.finalize()
    gc.collect()
    # A hung finalizer or __del__ now ends the process, its stack in the worker's log.
    faulthandler.dump_traceback_later(config.RAY_GRACE, exit=True)


# ---- cluster-wide activation -------------------------------------------------

def runtime_env_hook(runtime_env):
    """RAY_RUNTIME_ENV_HOOK=autoteardown.ray_runtime_env_hook: ship autoteardown to
    every worker of every job (py_modules) and install it there (setup hook),
    chaining the hook in AUTOTEARDOWN_NEXT_RUNTIME_ENV_HOOK and any setup hook already set."""
    runtime_env = dict(runtime_env or {})
    following = os.environ.get("AUTOTEARDOWN_NEXT_RUNTIME_ENV_HOOK")
    if following:
        from ray._common.utils import load_class

        runtime_env = dict(load_class(following)(runtime_env) or {})
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    modules = list(runtime_env.get("py_modules") or [])
    if package not in modules:
        modules.append(package)
    runtime_env["py_modules"] = modules
    existing = runtime_env.get("worker_process_setup_hook")
    if existing is None or existing in ("autoteardown.install", "autoteardown.integrations.ray.setup_hook"):
        runtime_env["worker_process_setup_hook"] = existing or "autoteardown.install"
    elif isinstance(existing, str):
        env_vars = dict(runtime_env.get("env_vars") or {})
        env_vars["AUTOTEARDOWN_NEXT_SETUP_HOOK"] = existing
        runtime_env["env_vars"] = env_vars
        runtime_env["worker_process_setup_hook"] = "autoteardown.integrations.ray.setup_hook"
    else:
        runtime_env["worker_process_setup_hook"] = _chain_setup_hook(existing)
    return runtime_env


def setup_hook():
    """A worker_process_setup_hook: install autoteardown, then run the hook it replaced."""
    import autoteardown

    autoteardown.install()
    following = os.environ.get("AUTOTEARDOWN_NEXT_SETUP_HOOK")
    if following:
        from ray._common.utils import load_class

        load_class(following)()


def _chain_setup_hook(following):
    def setup_then_following():
        import autoteardown

        autoteardown.install()
        following()

    return setup_then_following
