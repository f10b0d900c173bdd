"""The one after-fork hook of the package (as ddtrace's forksafe): each module registers
the reset of its own state, and they run in ORDER, in the child only.

The order is a rule, not an accident of imports: locks other threads may have held at
the fork first (threads, registry, importhook), then the SIGTERM and exit-status state,
then the engine, which empties the registry and hands each inherited resource to its
kind's in_child callback (that needs the registry's lock reset), then Ray's actor state
(ray_worker): Ray's clients belong to the process that made them, so a fork child of an actor
is no actor and never uses them. It comes last because nothing before it calls Ray, and an
integration's state is reset after the core's.
"""

import os

TYPE_CHECKING = False  # typing's own constant costs an import
if TYPE_CHECKING:
    from collections.abc import Callable

ORDER = ("threads", "registry", "importhook", "signals", "exitstatus", "engine", "ray_worker")
_hooks: "dict[str, Callable[[], None]]" = {}


def register(module: str, reset: "Callable[[], None]") -> None:
    """Call reset() in a fork child; `module` is the registering module's __name__ (its place in ORDER)."""
    name = module.rpartition(".")[2]
    if name not in ORDER:
        raise ValueError(f"{module} has no place in forksafe.ORDER")
    _hooks[name] = reset


def _after_in_child() -> None:
    for name in ORDER:
        reset = _hooks.get(name)
        if reset is not None:
            try:
                reset()
            except Exception:  # a fork child must go on; its own records say the rest
                pass


os.register_at_fork(after_in_child=_after_in_child)
