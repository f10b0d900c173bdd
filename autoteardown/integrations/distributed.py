"""torch.distributed process groups: destroy the ones this process created, rather than
leave them to the C++ destructors (NCCL warns or hangs, gloo can SIGABRT).

Groups made by `init_process_group` and `new_group` are destroyed after DataLoader workers.
Destroying the default group destroys every other, in the same order on every rank; no barrier
or collective, so no rank waits for another. This runs with `import torch` (it imports
torch.distributed): it only wraps functions.
"""

import sys

from .. import engine, log, registry
from . import Patches, contract, recording, supported

NAME, KIND, ORDER = "distributed", "process_group", 15
_patches = Patches()
get_version, unpatch = contract(NAME, _patches)


def patch():
    dist = sys.modules.get("torch.distributed")
    if _patches or dist is None or not dist.is_available() or not supported(NAME):
        return
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    engine.register_kind(KIND, ORDER, destroy_group)
    for name in ("init_process_group", "new_group"):
        # torch.distributed and device_mesh bind the same function by name (torch 2.13).
        _patches.rebind(getattr(c10d, name), recording(_record), "torch.distributed")
    if dist.is_initialized():  # initialized before autoteardown was imported
        _record(dist.group.WORLD)


def _record(group):
    dist = sys.modules["torch.distributed"]
    group = dist.group.WORLD if group is None else group  # init_process_group returns None
    if isinstance(group, dist.ProcessGroup):  # not new_group's sentinel on ranks outside it
        registry.record(KIND, group)  # pybind11 ProcessGroup takes weak references


def destroy_group(group, timeout):
    try:
        sys.modules["torch.distributed"].destroy_process_group(group)
    except ValueError:  # "Invalid process group": destroyed by the script or with the default group
        log.debug("process group already destroyed")


def describe(group):
    return f"{group.name()} group of {group.size()} rank(s)"
