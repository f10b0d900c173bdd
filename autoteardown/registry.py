"""The weak registry of what is alive now, by kind. Weak references only, per process (a
fork child starts empty: the engine's fork hook takes what it held). A record calls the one
callback the engine asks for (`call_at_record`: its arming, until the process is armed).
Readers take no lock (a dict copy is atomic under the GIL): the signal handler reads.
"""

import _thread
from _weakref import ref  # the C module: `weakref` would cost more than the rest of us

from . import forksafe

TYPE_CHECKING = False  # typing costs more than the rest of `import autoteardown`
if TYPE_CHECKING:
    from collections.abc import Callable

class _State:
    """The registry of this process; a fork child keeps its entries (the engine's fork hook takes
    them) and gets a new lock."""

    def __init__(self) -> None:
        self.lock = _thread.RLock()
        self.entries: dict = {}  # id(obj) -> (kind, weakref to obj)
        self.prune_at = 64       # dead entries are swept when the table reaches this size
        self.at_record: "Callable[[], None] | None" = None  # engine.arm, until this process is armed


_state = _State()


def call_at_record(callback: "Callable[[], None] | None") -> None:
    """Call `callback` after each record from now on (None: nothing)."""
    _state.at_record = callback


def calls_at_record() -> bool:
    return _state.at_record is not None


def record(kind: str, obj: object) -> None:
    weak, state = ref(obj), _state
    with state.lock:
        entries = state.entries
        entries[id(obj)] = (kind, weak)
        if len(entries) >= state.prune_at:
            for key in [key for key, (_, weak) in entries.items() if weak() is None]:
                del entries[key]
            state.prune_at = max(64, 2 * len(entries))
    callback = state.at_record
    if callback is not None:
        callback()


def forget(obj: object) -> None:
    with _state.lock:
        entry = _state.entries.get(id(obj))
        if entry is not None and entry[1]() is obj:
            del _state.entries[id(obj)]


def live(kind: str | None = None) -> list:
    """(kind, object) for every recorded object still alive, or the objects of `kind`; oldest first."""
    objs = [(entry_kind, weak()) for entry_kind, weak in list(_state.entries.values())]
    if kind is None:
        return [(k, obj) for k, obj in objs if obj is not None]
    return [obj for k, obj in objs if obj is not None and k == kind]


def take_all() -> list:
    """Empty the registry and return what was alive in it (used in a fork child)."""
    with _state.lock:
        entries = list(_state.entries.values())
        _state.entries.clear()
    return [(kind, weak()) for kind, weak in entries if weak() is not None]


def size() -> int:
    """Entries held, dead ones included (for the memory benchmark)."""
    with _state.lock:
        return len(_state.entries)


def _after_fork_in_child() -> None:
    _state.lock = _thread.RLock()  # another thread may have held it at the fork


forksafe.register(__name__, _after_fork_in_child)
