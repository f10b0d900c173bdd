"""The side that holds actor handles (a driver, an actor that creates actors, Ray
Train's controller): actors it ends really end, and live ones tear down first.

- After `__ray_terminate__` (sent, as every method call, through `ActorHandle._actor_method_call`)
  GCS marks the actor DEAD at once but keeps its pid and node; if its teardown hangs, the process
  lives on and `ray.kill` is a no-op.
- When the creating process exits, its actors are force-killed with no Python hook, and a call
  queued behind a running method never runs. So at its exit, at `ray.shutdown()` and before Ray
  kills its own processes (the head node's SIGTERM handler), each live, non-detached actor it
  created that recorded something (ray_worker._announce) or has processes of its own is sent
  SIGTERM, which ray_worker.py turns into its teardown; the others are left to Ray. A stopped job's
  GCS may be going away: its driver asks GCS nothing before the actors are sent SIGTERM, all at once
  (the pids were looked up soon after the actors started: `_learn`), and removes its keys after.
- Either way a driver that ended the actor hands the ending to the actor's guard on its node
  (ray_guard.py: through a zero-CPU task if that is another node, sent at once so that its worker
  starts within the grace), which kills it AUTOTEARDOWN_RAY_GRACE_S later if it is still there and
  then ends the processes it started; the driver waits for its answer.
  An actor that ends actors can itself be ended first, even with no Python hook (Ray kills an actor
  whose last handle is dropped at once), so it hands nothing on: the guard on the ended actor's node
  ends it at its due time and its processes once it is gone.
- An actor's key in GCS (ray_worker.ARMED) goes when it ends, removed by the process that ended it,
  and a driver removes all of its job's keys at its end: a shared cluster outlives its jobs.
"""

import atexit
import signal
import threading
import time

from .. import deadlines, engine, log, registry, threads
from ..patches import Patches
from . import kind_of, ray_worker
from .ray_guard import clock, descendants, end_answer, end_request, remote_end_on, same_worker, source

KIND = kind_of("ray")


class _State:
    def __init__(self) -> None:
        self.collected: list = []  # what the engine handed us at exit: handles and _Ending
        self.known: dict = {}      # actor id -> its GCS record once ALIVE or DEAD (pid, node; "seen": when)
        self.unarming: set = set()  # the ids of ended actors whose key (ray_worker.ARMED) is still to be removed
        self.unarm_lock = threading.Lock()
        self.exit_hooked = False    # in a driver: unarm_job is registered for its exit


_state = _State()
STOPPED_ASK_S = 0.5     # a stopped driver's one request to remove its job's keys


def patch(patches: Patches) -> None:
    import ray
    import ray._private.node
    import ray.actor

    patches.wrap(ray.actor.ActorHandle, "_actor_method_call", _on_actor_method_call)
    patches.wrap(ray.actor.ActorClass, "_remote", _on_actor_created)
    patches.wrap(ray, "shutdown", _on_shutdown)
    patches.wrap(ray, "kill", _on_kill)
    patches.wrap(ray._private.node.Node, "kill_all_processes", _on_shutdown)


def _on_actor_created(wrapped, instance, args, kwargs):
    handle = wrapped(*args, **kwargs)
    try:
        if not _state.exit_hooked and not ray_worker.in_actor():
            _state.exit_hooked = True
            atexit.register(unarm_job)  # after ray.init's own hook: runs before Ray's shutdown
        if not _detached(kwargs.get("lifetime")):  # a detached actor outlives us on purpose
            registry.record(KIND, handle)
            _learn(handle._ray_actor_id.hex(), 0.5)
    except Exception:
        log.debug_exception("could not record an actor handle")
    return handle


def _learn(actor_id, delay, give_up=None):
    """Look up a new actor's record once it is ALIVE: every `delay`, growing to 2 s, for a minute."""
    give_up = give_up or time.monotonic() + 60

    def lookup():
        import ray._private.state

        try:
            info = ray._private.state.actors(actor_id) or {}
        except Exception:  # GCS slow to answer (a loaded machine): ask again
            info = {}
        if info.get("State") in ("ALIVE", "DEAD") and info.get("Pid"):  # dead already: its descendants may live
            info["seen"] = time.time() if info["State"] == "ALIVE" else (info.get("EndTime") or 0) / 1000
            _state.known[actor_id] = info
        elif info.get("State") != "DEAD" and time.monotonic() < give_up:
            _learn(actor_id, min(2.0, delay * 1.5), give_up)

    threads.alarm(time.monotonic() + delay, lambda: threads.run_soon(lookup))


def _detached(lifetime):
    if lifetime is not None:
        return lifetime == "detached"
    import ray

    try:  # lifetime=None takes the job's default (JobConfig(default_actor_lifetime=...))
        from ray.core.generated import common_pb2

        job_config = ray._private.worker.global_worker.core_worker.get_job_config()
        return job_config.default_actor_lifetime == common_pb2.JobConfig.ActorLifetime.DETACHED
    except Exception:  # Ray Client has no core worker here: as before, the driver's
        log.debug_exception("could not read the job's default actor lifetime")
        return False


def _on_actor_method_call(wrapped, instance, args, kwargs):
    method_name = args[0] if args else kwargs.get("method_name")
    if method_name != "__ray_terminate__":
        return wrapped(*args, **kwargs)
    requested_at = time.time()
    result = wrapped(*args, **kwargs)
    _watch_ending(instance, requested_at)
    return result


def _on_kill(wrapped, instance, args, kwargs):
    requested_at = time.time()
    result = wrapped(*args, **kwargs)
    actor = args[0] if args else kwargs.get("actor")
    if (args[1] if len(args) > 1 else kwargs.get("no_restart", True)):  # Ray kills it; its descendants are ours
        _watch_ending(actor, requested_at)
    else:  # it restarts under the same id: nothing of it has ended for good
        _forget(actor)
    return result


def _watch_ending(handle, requested_at):
    """An actor told to end: not asked to finalize at exit; by a driver, watched until it and its
    descendants are gone. By an actor, nothing more: the actor's guard on its node ends it and its
    processes (ray_guard.py), however this actor ends, and the call asks GCS nothing."""
    try:
        info = _state.known.get(handle._ray_actor_id.hex())  # its learned record: no GCS request to locate it
        _forget(handle)
        _unarm(handle._ray_actor_id.hex())
        if ray_worker.in_actor():
            return
        ending = _Ending(handle, requested_at, info=info)
        registry.record(KIND, ending)  # the exit waits for it (see finalize_collected)
        threads.run_soon(ending.locate)
    except Exception:
        log.debug_exception("could not watch the actor being ended")


def _forget(actor):
    registry.forget(actor)
    _state.known.pop(actor._ray_actor_id.hex(), None)


def _on_shutdown(wrapped, instance, args, kwargs):
    if registry.live(KIND):  # our actors end before Ray's own processes
        engine.finalize(kinds=(KIND,))
    if instance is None:  # ray.shutdown(), not Node.kill_all_processes (GCS goes with it)
        unarm_job()
    return wrapped(*args, **kwargs)


# ---- the keys of the actors that said they have something to tear down ----------

def _unarm(actor_id):
    """An ended actor's key out of GCS (ray_worker.ARMED), off the caller's path: one runner removes the
    queued keys in turn (a GCS that does not answer costs it a second a key, never the caller)."""
    with _state.unarm_lock:
        idle = not _state.unarming
        _state.unarming.add(actor_id)
    if idle:
        threads.run_soon(_unarm_queued)


def _unarm_queued():
    import ray

    while not ray_worker.forked():  # Ray's clients are the process's that made them (ray_worker)
        with _state.unarm_lock:
            if not _state.unarming:
                return
            actor_id = next(iter(_state.unarming))
        try:
            ray._private.worker.global_worker.gcs_client.internal_kv_del(
                ray_worker.armed_key(actor_id), False, ray_worker.ARMED, timeout=1.0)
        except Exception:
            log.debug_exception("could not remove the key of actor %s", actor_id[:8])
        finally:
            with _state.unarm_lock:
                _state.unarming.discard(actor_id)


def unarm_job():
    """A driver's end (its exit, `ray.shutdown()`): every key of its job out of GCS in one request: an
    ended actor's that its runner did not get to, one an actor left when it ended with no hook, those of
    the actors an actor created. A stopped job asks briefly (STOPPED_ASK_S): a local Ray's GCS is going
    away with it, a shared cluster's stays and would keep the keys."""
    import ray

    try:
        if ray_worker.forked() or ray_worker.in_actor() or not ray.is_initialized():
            return  # a fork child inherits this hook, not the driver's Ray clients (ray_worker)
        job = ray.get_runtime_context().get_job_id()
        ray._private.worker.global_worker.gcs_client.internal_kv_del(
            f"{job}:".encode(), True, ray_worker.ARMED, timeout=STOPPED_ASK_S if ray_worker.stopped() else 1.0)
    except Exception:
        log.debug_exception("could not remove this job's keys from GCS")


# ---- at exit: everything at once, one wait ------------------------------------

def collect(obj, timeout):
    _state.collected.append(obj)


def finalize_collected(timeout):
    """SIGTERM the live actors that recorded something or have processes (all of them once this process
    took a SIGTERM: a second spent asking a dying GCS can be one the actors do not have), then wait for
    all to be gone."""
    deadline = time.monotonic() + timeout
    objs, _state.collected[:] = list(_state.collected), []
    handles = [o for o in objs if not isinstance(o, _Ending)]
    ids = [h._ray_actor_id.hex() for h in handles]
    announced, now = {} if ray_worker.stopped() else armed(ids), time.time()
    live = set(ids) if ray_worker.stopped() else {i for i, said in announced.items() if said != ray_worker.STARTED}
    live |= _with_processes(set(ids) - live, now, announced)
    ending = [o for o in objs if isinstance(o, _Ending)]
    ending += [_Ending(h, now, signal.SIGTERM, _state.known.pop(h._ray_actor_id.hex(), None)) for h in handles
               if h._ray_actor_id.hex() in live]
    try:
        for actor in ending:
            actor.locate()
        # The actors' grace, then their descendants' (the rule of ray_guard.py).
        until = min(deadline, deadlines.actors_gone(max((actor.due for actor in ending), default=0.0)))
        while not all([actor.poll() for actor in ending]) and time.monotonic() < until:
            time.sleep(0.05)
    finally:
        ray_worker.restore_ray_abort()
        if ray_worker.in_actor():  # its end comes at its grace; the guards go on with what is left
            _cancel_tasks(ending)
    idle = len(objs) - len(ending)
    trees = [f"{actor.class_name} {actor.actor_id[:8]} (pid {actor.pid}): {actor.ended} descendant(s) ended"
             for actor in ending if actor.ended]
    return "; ".join([f"{len(ending)} actor(s) ended" + (f", {idle} with nothing recorded left to Ray" if idle else "")]
                     + trees)


def _cancel_tasks(ending):
    """The tasks still ending actors on other nodes: Ray's exit of an actor would wait for its tasks."""
    import ray

    for actor in ending:
        if actor.kill_task is not None and not actor.done:
            try:
                ray.cancel(actor.kill_task, force=True)
            except Exception:
                log.debug_exception("could not cancel the task ending actor %s", actor.actor_id[:8])


def _with_processes(actor_ids, now, announced):
    """Which of these actors have processes of their own, or left some when they crashed: they are
    ended as the ones that recorded something, so that their descendants end after them. On this
    node psutil tells, from their learned records; on another, those that announced starting one
    (`announced`: its GCS key, read with the others). Asks no GCS."""
    if not actor_ids:
        return set()
    import ray

    try:
        here = ray.get_runtime_context().get_node_id()
    except Exception:
        here = None
    found = set()
    for actor_id in actor_ids:
        info = _state.known.get(actor_id) or {}
        pid, seen = info.get("Pid"), info.get("seen", now)
        if here is None or info.get("Address", {}).get("NodeID") != here:
            if actor_id in announced:
                found.add(actor_id)
        elif pid and (descendants(pid, seen) or (
                not same_worker(pid, seen) and descendants(pid, seen, actor_id, gone_at=clock()))):
            found.add(actor_id)
    return found


def armed(actor_ids):
    """{actor id: b"" (recorded something) or STARTED} of these actors; all as recorded if GCS is silent
    1 s. Their keys go: in an actor, off its path (_unarm); in a driver, with its job's (unarm_job)."""
    import ray

    try:
        keys = {ray_worker.armed_key(actor_id): actor_id for actor_id in actor_ids}
        gcs = ray._private.worker.global_worker.gcs_client
        found = gcs.internal_kv_multi_get(list(keys), ray_worker.ARMED, timeout=1.0) if keys else {}
    except Exception:
        log.debug_exception("could not ask GCS which actors recorded something")
        return dict.fromkeys(actor_ids, b"")
    if ray_worker.in_actor():
        for key in found:
            _unarm(keys[key])
    return {keys[key]: value for key, value in found.items()}


# ---- ending actors ------------------------------------------------------------

class _Ending:
    """An actor told to end (or sent `signum` now), handed to its job's guard on its node (ray_guard.py),
    and watched until the guard answers: the actor is gone, and so are the processes it started."""

    def __init__(self, handle, requested_at, signum=None, info=None):
        self.actor_id = handle._ray_actor_id.hex()
        descriptor = getattr(handle, "_ray_actor_creation_function_descriptor", None)
        self.class_name = getattr(descriptor, "class_name", None) or "actor"
        self.requested_at = requested_at  # wall clock: compared on the actor's node
        self.signum, self.info = signum, info  # info: its GCS record, if _learn has it
        # Its process is one created before this (wall clock): a later process at its pid is not it.
        self.not_after = min(requested_at, (info or {}).get("seen", requested_at))
        self.due = time.monotonic() + deadlines.grace()
        self.pid = self.kill_task = self.sock = None  # the guard's answer comes through the task or the socket
        self.ended = 0           # how many of its processes were running when it was gone
        self.done = False
        self._lock = threading.Lock()  # poll() runs in the exit's wait and in the timer's runner

    def locate(self):
        """Find the actor's process (GCS keeps it after DEAD) and hand its ending to its guard, through a
        task there if it is on another node."""
        import ray
        import ray._private.state

        if self.pid is not None:
            return
        self.pid = 0  # being located
        try:
            info = self.info or ray._private.state.actors(self.actor_id) or {}
            state, ended_ms, pid = info.get("State"), info.get("EndTime") or 0, info.get("Pid") or 0
            if pid <= 0 or state not in ("ALIVE", "DEAD"):
                return self.finish()
            if state == "DEAD" and ended_ms:  # a process at its pid created after that is not it
                self.not_after = min(self.not_after, ended_ms / 1000)
            here = ray.get_runtime_context().get_node_id()
            node_id = info.get("Address", {}).get("NodeID") or here
            grace = deadlines.grace()
            request = (node_id, pid, self.not_after, self.actor_id, self.requested_at + grace, grace,
                       self.signum or 0, source())
            if node_id != here:
                self.kill_task = remote_end_on(node_id).remote(*request)
            else:
                self.sock = end_request(*request)
                if self.sock is None:
                    log.debug("no guard took the ending of actor %s", self.actor_id[:8])
                    return self.finish()
            self.pid = pid
            self.watch()
        except Exception:
            log.debug_exception("ending actor %s failed", self.actor_id[:8])
            self.finish()

    def watch(self):
        if not self.poll():
            threads.alarm(time.monotonic() + 0.5, lambda: threads.run_soon(self.watch))

    def poll(self):
        """Done yet: has its guard answered (or, past the time it has to, is it given up)?"""
        import ray

        with self._lock:
            if self.done or not self.pid:
                return self.done  # or still being located
            try:
                if self.kill_task is not None:
                    ready, _ = ray.wait([self.kill_task], timeout=0)
                    if not ready and time.monotonic() < self.due + deadlines.REMOTE_TASK_S:
                        return False
                    answer = ray.get(ready[0], timeout=0) if ready else (False, 0)
                else:
                    answer = end_answer(self.sock, 0)
                    if answer is None and time.monotonic() < deadlines.actors_gone(self.due) + 1.0:
                        return False
                killed, self.ended = answer or (False, 0)
                if killed:
                    log.warning("%s %s (pid %d) still running %.1fs after %s: killed", self.class_name,
                                self.actor_id[:8], self.pid, deadlines.grace(),
                                "SIGTERM" if self.signum else "__ray_terminate__")
                if self.ended:
                    log.debug("%s %s (pid %d): %d descendant(s) ended", self.class_name, self.actor_id[:8],
                              self.pid, self.ended)
            except Exception:
                log.debug_exception("reaping actor %s failed", self.actor_id[:8])
            self.finish()
            return True

    def finish(self):
        self.done = True
        if self.sock is not None:
            self.sock.close()
        registry.forget(self)
