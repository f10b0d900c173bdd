"""Ray actors: an actor told to end really ends, and what it held is finalized first.

Three ideas, one module each:
- ray_driver.py: any process that holds actor handles (the driver, an actor that
  creates actors, Ray Train's controller) reaps actors that hang after
  `__ray_terminate__`, and asks its live actors to finalize in-band at exit.
- ray_worker.py: inside an actor, finalize in-band before Ray kills the
  actor's children (exit_actor, the worker's SIGTERM path, Ray Train v2's
  worker shutdown), then make sure the process cannot outlive the grace period.
- ray_cluster.py: the runtime_env hook that brings the shim (and wrapt) to
  every worker of a cluster.

Tested on ray 2.40.0 and 2.60.0 (the private names used: ActorHandle._actor_method_call,
ActorClass._remote, ray._private.state.actors, ray._private.worker's
raise_sys_exit_with_custom_error_message, Ray Train v2's RayTrainWorker.shutdown).
"""

import sys

from .. import engine, log
from . import Patches, check_version
from . import ray_cluster, ray_driver, ray_worker

KIND = ray_driver.KIND
SUPPORTED = "ray >= 2.40, < 2.61"  # tested: 2.40.0, 2.60.0
_patches = Patches()

# Kept importable here: autoteardown.ray_runtime_env_hook delegates to it and
# users' configurations name these paths.
runtime_env_hook = ray_cluster.runtime_env_hook
setup_hook = ray_cluster.setup_hook


def get_version():
    return getattr(sys.modules.get("ray"), "__version__", None)


def unsupported_reason():
    return check_version("ray", "2.40", "2.61")


def patch():
    if _patches:
        return
    reason = unsupported_reason()
    if reason:
        log.warning_once("%s; Ray actors are left alone", reason, tree=True)
        return
    ray_driver.patch(_patches)
    ray_worker.patch(_patches)
    engine.arm()


def unpatch():
    _patches.restore()
    ray_worker.unpatch()
