"""torch.distributed process groups: destroy the ones this process created, rather than
leave them to the C++ destructors (NCCL warns or hangs, gloo can SIGABRT).

Groups made by `init_process_group` and `new_group` are destroyed after DataLoader workers.
Destroying the default group destroys every other, in the same order on every rank; no barrier
or collective, so no rank waits for another. This runs with `import torch` (it imports
torch.distributed): it only wraps functions.
"""

import sys

from .. import log, registry
from ..patches import Patches
from . import kind_of, recording

KIND = kind_of(__name__)


def patch(patches: Patches) -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    for name in ("init_process_group", "new_group"):
        # torch.distributed and device_mesh bind the same function by name (torch 2.13).
        patches.rebind(getattr(c10d, name), recording(_record), "torch.distributed")
    if dist.is_initialized():  # initialized before autoteardown was imported
        _record(dist.group.WORLD)


def _record(group):
    dist = sys.modules["torch.distributed"]
    group = dist.group.WORLD if group is None else group  # init_process_group returns None
    if isinstance(group, dist.ProcessGroup):  # not new_group's sentinel on ranks outside it
        registry.record(KIND, group)  # pybind11 ProcessGroup takes weak references


def finalize_one(group, timeout: float) -> None:
    """Destroy the group."""
    try:
        sys.modules["torch.distributed"].destroy_process_group(group)
    except ValueError:  # "Invalid process group": destroyed by the script or with the default group
        log.debug("process group already destroyed")


def describe(group) -> str:
    return f"{group.name()} group of {group.size()} rank(s)"
