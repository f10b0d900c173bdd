"""The weak registry: what is alive now, by kind ("dataloader", "wandb", "ray").

It holds weak references only, so recording a resource never keeps it alive. It
belongs to one process: a forked child starts empty, and the kinds' fork callbacks get
the parent's objects first so that the child never touches them (engine.py). The first
record in a process arms the exit engine (`on_record`). Writers take the lock; readers
do not (a dict copy is atomic under the GIL), so the signal handler may read.
"""

import os
import _thread
from _weakref import ref  # the C module: `weakref` would cost more than the rest of us

_lock = _thread.RLock()
_entries = {}      # id(obj) -> (kind, weakref to obj)
_prune_at = 64     # dead entries are swept when the table reaches this size
on_record = None   # engine.arm, until this process is armed (set again in a fork child)


def record(kind, obj):
    """Remember `obj` as a live resource of `kind` in this process."""
    global _prune_at
    weak = ref(obj)
    with _lock:
        _entries[id(obj)] = (kind, weak)
        if len(_entries) >= _prune_at:
            _prune()
            _prune_at = max(64, 2 * len(_entries))
    if on_record is not None:
        on_record()


def forget(obj):
    with _lock:
        entry = _entries.get(id(obj))
        if entry is not None and entry[1]() is obj:
            del _entries[id(obj)]


def live(kind=None):
    """The recorded objects that are still alive, oldest first."""
    entries = list(_entries.values())
    objs = []
    for entry_kind, ref in entries:
        obj = ref()
        if obj is not None and (kind is None or entry_kind == kind):
            objs.append((entry_kind, obj))
    return objs if kind is None else [obj for _, obj in objs]


def take_all():
    """Empty the registry and return what was alive in it (used in a fork child)."""
    with _lock:
        entries = list(_entries.values())
        _entries.clear()
    return [(kind, ref()) for kind, ref in entries if ref() is not None]


def _prune():
    dead = [key for key, (_, ref) in _entries.items() if ref() is None]
    for key in dead:
        del _entries[key]


def size():
    """Entries held, dead ones included (for the memory benchmark)."""
    with _lock:
        return len(_entries)


def _after_fork_in_child():
    global _lock
    _lock = _thread.RLock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)
