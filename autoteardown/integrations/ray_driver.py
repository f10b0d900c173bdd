"""The side that holds actor handles (a driver, an actor that creates actors,
Ray Train's controller): terminated actors really end; live actors finalize
in-band before Ray force-kills them.

Facts (ray 2.40 and 2.60):
- Every actor method call, `__ray_terminate__` included (with or without
  `.options()`), goes through `ActorHandle._actor_method_call(method_name, ...)`.
- After `__ray_terminate__` GCS marks the actor DEAD at once, but keeps its
  pid and node. If its interpreter teardown then hangs, the process lives on
  with its memory and `ray.kill` is a silent no-op. So the process that sent
  the request kills the pid after AUTOTEARDOWN_RAY_GRACE_S: the GCS lookup runs
  in a runner (never in the caller's thread), and the helper thread's timer
  (signals.alarm) brings the kill when the grace is over. For an actor on another
  node a zero-CPU task pinned there is sent at once, waits out the grace on that
  node and kills (sent only when due, it needs a fresh worker process there first:
  2.3 s measured).
- When the creating process exits, its actors are force-killed with no Python
  hook; so at its exit (or `ray.shutdown()`) each live, non-detached actor it
  created is sent `__ray_call__(finalize_in_actor)`, all at once, and one wait
  covers them all.
"""

import sys
import time

from .. import config, engine, log, registry

KIND = "ray"
ORDER = 20
_collected = []       # what the engine handed us at exit: handles and _Terminated
_detached_job = {}    # job id -> whether the job's actors are detached by default


def patch(patches):
    import ray
    import ray.actor

    engine.register_kind(KIND, ORDER, collect, after_all=finalize_collected)
    patches.wrap(ray.actor.ActorHandle, "_actor_method_call", _on_actor_method_call)
    patches.wrap(ray.actor.ActorClass, "_remote", _on_actor_created)
    patches.wrap(ray, "shutdown", _on_shutdown)
    patches.wrap(ray, "kill", _on_kill)


def _on_actor_created(wrapped, instance, args, kwargs):
    handle = wrapped(*args, **kwargs)
    try:
        if not _detached(kwargs.get("lifetime")):  # a detached actor outlives us on purpose
            registry.record(KIND, handle)
    except Exception:
        log.debug_exception("could not record an actor handle")
    return handle


def _detached(lifetime):
    if lifetime is not None:
        return lifetime == "detached"
    import ray

    # lifetime=None takes the job's default (JobConfig(default_actor_lifetime=...)).
    worker = ray._private.worker.global_worker
    try:
        job = worker.current_job_id.hex()
        if job not in _detached_job:
            from ray.core.generated import common_pb2

            job_config = worker.core_worker.get_job_config()
            _detached_job[job] = job_config.default_actor_lifetime == common_pb2.JobConfig.ActorLifetime.DETACHED
        return _detached_job[job]
    except Exception:  # Ray Client has no core worker here: as before, the driver's
        log.debug_exception("could not read the job's default actor lifetime")
        return False


def _on_actor_method_call(wrapped, instance, args, kwargs):
    method_name = args[0] if args else kwargs.get("method_name")
    if method_name != "__ray_terminate__":
        return wrapped(*args, **kwargs)
    requested_at = time.time()
    result = wrapped(*args, **kwargs)
    try:
        registry.forget(instance)  # it will not be asked to finalize: it is ending
        terminated = _Terminated(instance._ray_actor_id.hex(), requested_at)
        registry.record(KIND, terminated)  # the exit waits for it (see finalize_collected)
        engine.run_soon(terminated.locate)
    except Exception:
        log.debug_exception("could not watch the actor being terminated")
    return result


def _on_kill(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    try:  # killed on purpose, with no teardown: nothing to ask it at exit
        registry.forget(args[0] if args else kwargs.get("actor"))
    except Exception:
        log.debug_exception("could not forget a killed actor")
    return result


def _on_shutdown(wrapped, instance, args, kwargs):
    engine.finalize(kinds=(KIND,))
    return wrapped(*args, **kwargs)


# ---- at exit: everything at once, one wait ------------------------------------

def collect(obj, timeout):
    _collected.append(obj)


def finalize_collected(timeout):
    """Ask every live actor to finalize in-band and wait for the terminated ones'
    grace, all in parallel, within `timeout`."""
    import ray

    deadline = time.monotonic() + timeout
    objs, _collected[:] = list(_collected), []
    handles = [o for o in objs if not isinstance(o, _Terminated)]
    terminated = [o for o in objs if isinstance(o, _Terminated)]
    refs = {}
    if handles and ray.is_initialized():
        in_actor = max(0.1, timeout - 1.0)  # the actor's deadline, a second inside ours: its reply comes in time
        for handle in handles:
            try:
                refs[handle.__ray_call__.remote(_finalize_in_actor, in_actor)] = handle
            except Exception:
                log.debug_exception("could not ask actor %s to finalize", _short(handle))
    if refs:
        wait = max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=wait)
        for ref in ready:
            try:
                log.debug("actor %s finalized in-band: %s", _short(refs[ref]), ray.get(ref, timeout=0))
            except ray.exceptions.RayError as exc:  # dead already, or could not run it
                log.debug("actor %s not finalized: %s", _short(refs[ref]), type(exc).__name__)
        if pending:
            log.warning("%d actor(s) did not finalize within %.1fs: %s", len(pending), wait,
                        ", ".join(_short(refs[r]) for r in pending))
    if terminated:
        _drain(terminated, deadline)


def _short(handle):
    try:
        return handle._ray_actor_id.hex()[:8]
    except Exception:
        return repr(handle)


def _make_finalize_in_actor():
    # Defined inside a function so that cloudpickle sends it by value: the actor
    # needs no autoteardown to run it, and does nothing if the shim is not there.
    def finalize_in_actor(actor, timeout):
        worker_side = sys.modules.get("autoteardown.integrations.ray_worker")
        if worker_side is not None and hasattr(worker_side, "finalize_requested"):
            worker_side.finalize_requested(timeout)  # a Ray Train worker hands on its code
            return True
        shim = sys.modules.get("autoteardown")
        if shim is None:
            return False
        shim.finalize(timeout)
        return True

    return finalize_in_actor


_finalize_in_actor = _make_finalize_in_actor()


# ---- reaping terminated actors --------------------------------------------------

class _Terminated:
    """An actor told to end, watched until its process is really gone."""

    def __init__(self, actor_id, requested_at):
        self.actor_id = actor_id
        self.requested_at = requested_at                      # wall clock: compared on the actor's node
        self.due = time.monotonic() + config.RAY_GRACE
        self.pid = self.node_id = self.kill_task = self.class_name = None
        self.local = True
        self.done = False

    def locate(self):
        """In a runner: find the actor's process (GCS keeps it after DEAD), then look
        again when the grace is over (here) or watch the task that kills it (there)."""
        import ray
        import ray._private.state

        try:
            info = ray._private.state.actors(self.actor_id) or {}
            self.pid = info.get("Pid") or 0
            self.class_name = info.get("ActorClassName") or "actor"
            ended_ms = info.get("EndTime") or 0
            # DEAD before our request (ended earlier): its pid may belong to someone else by now.
            if self.pid <= 0 or info.get("State") not in ("ALIVE", "DEAD") or (
                    info.get("State") == "DEAD" and 0 < ended_ms < (self.requested_at - 1.0) * 1000):
                return self.finish()
            self.node_id = info.get("Address", {}).get("NodeID")
            self.local = not self.node_id or self.node_id == ray.get_runtime_context().get_node_id()
            if not self.local:
                self.kill_task = _remote_kill_on(self.node_id).remote(
                    self.pid, self.requested_at, self.requested_at + config.RAY_GRACE)
            self.later(self.due if self.local else self.due + 0.5)
        except Exception:
            log.debug_exception("reaping actor %s failed", self.actor_id[:8])
            self.finish()

    def later(self, when):
        from .. import signals

        signals.alarm(when, lambda: engine.run_soon(self.check))

    def check(self):
        if self.done:
            return
        try:
            if self.local:
                self.reap_here()
            elif not self.task_finished() and time.monotonic() < self.due + 30:
                return self.later(time.monotonic() + 0.5)
        except Exception:
            log.debug_exception("reaping actor %s failed", self.actor_id[:8])
        self.finish()

    def finish(self):
        self.done = True
        registry.forget(self)

    def gone_here(self):
        import psutil

        try:
            return psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def task_finished(self):
        import ray

        ready, _ = ray.wait([self.kill_task], timeout=0)
        if ready:
            self.report(ray.get(ready[0], timeout=0))
        return bool(ready)

    def reap_here(self):
        self.report(_kill_if_same_process(self.pid, self.requested_at))

    def report(self, killed):
        if killed:
            log.warning("%s %s (pid %d) still running %.1fs after __ray_terminate__: killed",
                        self.class_name, self.actor_id[:8], self.pid, time.time() - self.requested_at)


def _drain(terminated, until):
    """At exit: wait for these to be reaped, until `until` (monotonic) at the latest. One
    on this node that is gone already ends its wait at once (not our child: polled)."""
    pending = [t for t in terminated if not t.done]
    until = min(until, max((t.due for t in pending), default=0.0) + 1.0)
    while pending and time.monotonic() < until:
        time.sleep(0.05)
        pending = [t for t in pending if not t.done and not (t.local and t.pid and t.gone_here())]
    for t in pending:  # the timer may not get to them before the process ends
        if t.local and t.pid and not t.done and time.monotonic() >= t.due:
            t.done = True
            t.reap_here()


def _make_kill_if_same_process():
    # By value (see above): these also run in a zero-CPU task on the actor's node.
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

    def kill_when_due(pid, not_after, due):
        """Wait until `due` (wall clock) unless `pid` ends first, then kill it if it is still there."""
        import time

        import psutil

        while time.time() < due:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                return False
            time.sleep(0.05)
        return kill_if_same_process(pid, not_after)

    return kill_if_same_process, kill_when_due


_kill_if_same_process, _kill_when_due = _make_kill_if_same_process()


def _remote_kill_on(node_id):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_kill_when_due)
    return task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))
