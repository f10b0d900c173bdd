"""Ray actors: an actor that is ended really ends, and what it held is finalized first.

ray_driver.py (the side that holds actor handles), ray_worker.py (inside an actor) and
ray_cluster.py (the runtime_env hook) each state their rules. Tested on ray 2.40.0 and 2.60.0; the
private names relied on: ActorHandle._actor_method_call, ActorClass._remote, Node.kill_all_processes,
ray._private.state.actors, ray._private.utils.set_sigterm_handler,
FunctionActorManager._make_actor_method_executor, the GCS client's internal_kv_*, Ray Train v2's
RayTrainWorker.shutdown and thread_runner.construct_user_exception_with_traceback, and Ray Tune's
CallbackList.on_experiment_end and its logger callbacks' own (ray_tune.py).
"""

from ..patches import Patches
from . import ray_driver, ray_worker

# Importable here: autoteardown.ray_runtime_env_hook delegates to it, users' configurations name it.
from .ray_cluster import runtime_env_hook, setup_hook  # noqa: F401

finalize_one, after_all = ray_driver.collect, ray_driver.finalize_collected


def patch(patches: Patches) -> None:
    ray_driver.patch(patches)
    ray_worker.patch(patches)


def describe(obj) -> "str | None":
    if hasattr(obj, "actor_id") and hasattr(obj, "pid"):  # an actor told to end, being watched
        return f"terminated actor {str(obj.actor_id)[:8]} (pid {obj.pid})"
    descriptor = getattr(obj, "_ray_actor_creation_function_descriptor", None)
    actor_id = getattr(obj, "_ray_actor_id", None)
    if descriptor is None and actor_id is None:
        return None
    short = actor_id.hex()[:8] if actor_id is not None else "?"
    return f"actor {getattr(descriptor, 'class_name', None) or 'Actor'} {short}"
