"""torch.distributed process groups: destroy the ones this process created.

A script that never calls `destroy_process_group()` leaves its groups to the
C++ destructors at interpreter teardown. Recent torch warns there with NCCL
("process group has NOT been destroyed before we destruct ProcessGroupNCCL")
and NCCL can hang the exit; with gloo (torch 2.13, CPU) 5 of 20 two-rank runs
had a rank die of SIGABRT ("terminate called without an active exception").
We record the groups made by `init_process_group` and `new_group` and destroy
them at order 15: after DataLoader workers (10), before wandb runs (30).

`destroy_process_group()` on the default group shuts down every group (those of
`split_group` too), in an order that is the same on every rank; a subgroup
recorded after it is then already gone. It runs no collective: a barrier at exit
could wait forever for a rank that exits for another reason. A backend that
blocks anyway is bounded by the engine's deadline.

`import torch` imports torch.distributed (torch 2.13), so this runs with torch:
it only wraps functions and imports nothing more.
"""

import sys

from .. import engine, log, registry
from . import Patches, get_version as _version, supported

NAME, KIND, ORDER = "distributed", "process_group", 15
FUNCTIONS = ("init_process_group", "new_group")
_patches = Patches()


def get_version():
    return _version(NAME)


def patch():
    dist = sys.modules.get("torch.distributed")
    if _patches or dist is None or not dist.is_available() or not supported(NAME):
        return
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    engine.register_kind(KIND, ORDER, destroy_group)
    for name in FUNCTIONS:
        # torch.distributed and device_mesh bind the same function by name (torch 2.13).
        _patches.rebind(getattr(c10d, name), _record_group, "torch.distributed")
    if dist.is_initialized():  # initialized before autoteardown was imported
        _record(dist.group.WORLD)


def unpatch():
    _patches.restore()


def _record_group(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    try:
        dist = sys.modules["torch.distributed"]
        # init_process_group returns None; new_group returns an int sentinel on
        # ranks outside the group (GroupMember.NON_GROUP_MEMBER).
        _record(dist.group.WORLD if wrapped.__name__ == "init_process_group" else result)
    except Exception:
        log.debug_exception("could not record the group made by %s", wrapped.__name__)
    return result


def _record(group):
    if isinstance(group, sys.modules["torch.distributed"].ProcessGroup):
        registry.record(KIND, group)  # pybind11 ProcessGroup takes weak references


def destroy_group(group, timeout):
    dist = sys.modules["torch.distributed"]
    try:
        dist.destroy_process_group(group)
    except ValueError:  # "Invalid process group": destroyed by the script or with the default group
        log.debug("process group already destroyed")


def describe(group):
    return f"{group.name()} group of {group.size()} rank(s)"
