"""The side that holds actor handles (a driver, an actor that creates actors,
Ray Train's controller): terminated actors really end; live actors finalize
in-band before Ray force-kills them.

Facts (ray 2.40 and 2.60):
- Every actor method call, `__ray_terminate__` included (with or without
  `.options()`), goes through `ActorHandle._actor_method_call(method_name, ...)`.
- After `__ray_terminate__` GCS marks the actor DEAD at once, but keeps its
  pid and node. If its interpreter teardown then hangs, the process lives on
  with its memory and `ray.kill` is a silent no-op. So the process that sent
  the request kills the pid after AUTOTEARDOWN_RAY_GRACE_S: one daemon thread
  does it for every terminated actor on this node; for an actor on another node
  a zero-CPU task pinned there is sent at once, waits out the grace on that node
  and kills. (Sent only when due, it needs a fresh worker process there first:
  2.3 s measured.) The GCS lookup runs in that thread, never in the caller's.
- When the creating process exits, its actors are force-killed with no Python
  hook; so at its exit (or `ray.shutdown()`) each live, non-detached actor it
  created is sent `__ray_call__(finalize_in_actor)`, all at once, and one wait
  covers them all.
"""

import heapq
import itertools
import os
import sys
import threading
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
        _reaper.add(_Terminated(instance._ray_actor_id.hex(), requested_at))
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

    started = time.monotonic()
    objs, _collected[:] = list(_collected), []
    handles = [o for o in objs if not isinstance(o, _Terminated)]
    terminated = [o for o in objs if isinstance(o, _Terminated)]
    refs = {}
    if handles and ray.is_initialized():
        in_actor = max(0.1, timeout - 1.0)  # the actor's own deadline, inside ours
        for handle in handles:
            try:
                refs[handle.__ray_call__.remote(_finalize_in_actor, in_actor)] = handle
            except Exception:
                log.debug_exception("could not ask actor %s to finalize", _short(handle))
    if refs:
        wait = max(0.0, timeout - 0.5 - (time.monotonic() - started))
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
        _reaper.drain(terminated, started + timeout - 0.25)


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
        """Find the actor's process (GCS keeps it after DEAD); False if there is none to watch."""
        import ray
        import ray._private.state

        info = ray._private.state.actors(self.actor_id) or {}
        self.pid = info.get("Pid") or 0
        self.class_name = info.get("ActorClassName") or "actor"
        ended_ms = info.get("EndTime") or 0
        # DEAD before our request (ended earlier): its pid may belong to someone else by now.
        if self.pid <= 0 or info.get("State") not in ("ALIVE", "DEAD") or (
                info.get("State") == "DEAD" and 0 < ended_ms < (self.requested_at - 1.0) * 1000):
            return False
        self.node_id = info.get("Address", {}).get("NodeID")
        self.local = not self.node_id or self.node_id == ray.get_runtime_context().get_node_id()
        if not self.local:
            self.kill_task = _remote_kill_on(self.node_id).remote(
                self.pid, self.requested_at, self.requested_at + config.RAY_GRACE)
        return True

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
            try:
                self.report(ray.get(ready[0], timeout=0))
            except Exception:
                log.debug_exception("reaping actor %s on node %s failed", self.actor_id[:8], self.node_id[:8])
        return bool(ready)

    def reap_here(self):
        self.report(_kill_if_same_process(self.pid, self.requested_at))

    def report(self, killed):
        if killed:
            log.warning("%s %s (pid %d) still running %.1fs after __ray_terminate__: killed",
                        self.class_name, self.actor_id[:8], self.pid, time.time() - self.requested_at)


class _Reaper:
    """One daemon thread for every terminated actor: looks each one up, then kills
    it here when its grace is over, or watches the task that does so on its node."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._new = []
        self._heap = []              # (when, seq, _Terminated): the next look at it
        self._seq = itertools.count()
        self._pid = None             # the process the thread runs in (none after fork)

    def add(self, terminated):
        registry.record(KIND, terminated)  # the exit waits for it (see finalize_collected)
        with self._cond:
            self._new.append(terminated)
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._heap.clear()
                threading.Thread(target=self._run, name="autoteardown-ray-reaper", daemon=True).start()
            self._cond.notify()

    def _run(self):
        while True:
            with self._cond:
                while not self._new and not (self._heap and self._heap[0][0] <= time.monotonic()):
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                new, self._new = self._new, []
                due = []
                while self._heap and self._heap[0][0] <= time.monotonic():
                    due.append(heapq.heappop(self._heap)[2])
            for terminated in new:
                self._step(terminated, located=False)
            for terminated in due:
                self._step(terminated, located=True)

    def _step(self, terminated, located):
        if terminated.done:
            return
        try:
            if not located:
                if not terminated.locate():
                    return self._finish(terminated)
                # Here: look again when the grace is over. Elsewhere: the task is on its way.
                return self._later(terminated, terminated.due if terminated.local else terminated.due + 0.5)
            if terminated.local:
                terminated.reap_here()
                return self._finish(terminated)
            if terminated.task_finished() or time.monotonic() > terminated.due + 30:
                return self._finish(terminated)
            self._later(terminated, time.monotonic() + 0.5)
        except Exception:
            log.debug_exception("reaping actor %s failed", terminated.actor_id[:8])
            self._finish(terminated)

    def _later(self, terminated, when):
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), terminated))
            self._cond.notify()

    def _finish(self, terminated):
        terminated.done = True
        registry.forget(terminated)

    def drain(self, terminated, until):
        """At exit: wait for these to be reaped, until `until` (monotonic) at the latest.
        One on this node that is already gone ends its wait at once."""
        pending = list(terminated)
        until = min(until, max(t.due for t in pending) + 1.0)
        while pending and time.monotonic() < until:
            time.sleep(0.05)
            pending = [t for t in pending if not t.done and not (
                t.local and t.pid and t.gone_here())]
        for t in pending:  # the thread may not get to them before the process ends
            if t.local and t.pid and not t.done and time.monotonic() >= t.due:
                t.done = True
                t.reap_here()


_reaper = _Reaper()


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
