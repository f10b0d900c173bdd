"""The integration table, and the one gate every integration goes through.

`TABLE` names each integration: the resource kind it records, the kind's order in the
teardown, the modules whose import triggers it, what it looks after, and the
distributions it supports. `instrument(name)` is the gate (as OpenTelemetry's
`instrument()`): the version check and its one warning, idempotency, the kind's
registration with the engine, and the module's `patch(patches)`; `uninstrument(name)`
puts back what it wrapped. A module `integrations/<name>.py` says only what it wraps and
how to finalize: it keeps the `Integration` protocol below. It is imported only when one
of its trigger modules is; no two integrations share a trigger. Modules an integration
patches only if they are imported after it (Ray Train's, Ray Tune's) are its `later`
triggers: the gate registers their hooks with the rest and removes them in `uninstrument`,
and hands each such patch the integration's `Patches` (`patches_of`), so that nothing an
integration wraps is out of the gate's reach.
"""

from .. import importhook

TYPE_CHECKING = False  # typing costs more than the rest of `import autoteardown`
if TYPE_CHECKING:
    from typing import Any, Callable, Protocol

    from ..patches import Patches

    class Module(Protocol):
        """What integrations/<name>.py defines (after_all, in_child, on_sigterm optional)."""

        def patch(self, patches: Patches) -> None: ...
        def finalize_one(self, obj: Any, timeout: float) -> "str | None": ...
        def describe(self, obj: Any) -> "str | None": ...


class Requirement:
    """An installed `distribution` must lie in [minimum, below)."""

    __slots__ = ("distribution", "minimum", "below")

    def __init__(self, distribution: str, minimum: str, below: "str | None" = None) -> None:
        self.distribution, self.minimum, self.below = distribution, minimum, below

    def __str__(self) -> str:
        return f"{self.distribution} >={self.minimum}" + (f",<{self.below}" if self.below else "")


class Integration:
    """One row of TABLE. `later`: module -> "submodule:function" of this package, called with
    that module and the integration's Patches when it is imported after the integration is."""

    __slots__ = ("kind", "order", "triggers", "looks_after", "requires", "later")

    def __init__(self, kind: str, order: int, triggers: "tuple[str, ...]", looks_after: str,
                 *requires: Requirement, later: "dict[str, str] | None" = None) -> None:
        self.kind, self.order, self.triggers, self.looks_after, self.requires = (
            kind, order, triggers, looks_after, requires)
        self.later = later or {}


# The order is the teardown's: workers before the groups they may use, the groups and the
# actors before the trackers, a local write (swanlab, trackio) before mlflow's and wandb's
# ends, which can take seconds.
TABLE = {
    "torch": Integration("dataloader", 10, ("torch.utils.data", "torchdata.stateful_dataloader"),
                         "DataLoader workers", Requirement("torch", "2.0"), Requirement("torchdata", "0.8")),
    "distributed": Integration("process_group", 15, ("torch.distributed",), "process groups",
                               Requirement("torch", "2.0")),
    # A save in flight completes after the workers end (at once) and before the groups it gathers over.
    "checkpoint": Integration("checkpoint", 12, ("torch.distributed.checkpoint",), "async checkpoint saves",
                              Requirement("torch", "2.0")),
    "tensorboard": Integration("tensorboard", 25, ("torch.utils.tensorboard", "tensorboardX"), "SummaryWriters",
                               Requirement("tensorboard", "2.0"), Requirement("tensorboardX", "2.0")),
    "wandb": Integration("wandb", 30, ("wandb",), "wandb runs", Requirement("wandb", "0.22", "0.32")),
    "ray": Integration("ray", 20, ("ray",), "Ray actors", Requirement("ray", "2.40", "2.61"), later={
        "ray.train.v2._internal.execution.worker_group.worker": "ray_worker:patch_train_worker",
        "ray.train.v2._internal.execution.worker_group.thread_runner": "ray_worker:patch_train_runner",
        "ray.tune.callback": "ray_tune:patch_callbacks",
        "ray.air.integrations.wandb": "ray_tune:patch_wandb_logger"}),
    # mlflow-skinny provides the same `mlflow` package, without the server.
    "mlflow": Integration("mlflow", 28, ("mlflow",), "mlflow runs", Requirement("mlflow", "2.10", "4"),
                          Requirement("mlflow-skinny", "2.10", "4")),
    # These three rely on private names of the releases their modules name as tested.
    "swanlab": Integration("swanlab", 26, ("swanlab",), "swanlab runs", Requirement("swanlab", "0.9.8", "0.11")),
    "trackio": Integration("trackio", 27, ("trackio",), "trackio runs", Requirement("trackio", "0.40", "0.44")),
    "aim": Integration("aim", 23, ("aim",), "Aim runs", Requirement("aim", "3.29", "3.30")),
    "comet": Integration("comet", 29, ("comet_ml",), "Comet experiments", Requirement("comet_ml", "3.58")),
    # After the local writes: a task stopped by SIGTERM waits up to 5 s for clearml's reporting subprocess.
    "clearml": Integration("clearml", 29, ("clearml",), "ClearML tasks", Requirement("clearml", "2.1", "2.2")),
}
_patches: "dict[str, Patches]" = {}            # name -> what it wrapped, once instrumented
_triggered: "dict[str, frozenset[str]]" = {}   # name -> the trigger modules it was patched for
_declare: "list[Callable[..., None]]" = []     # engine.register_kind, once install() hands it in


def declare_kinds_to(register_kind: "Callable[..., None]") -> None:
    """The gate declares each integration's kind through `register_kind` (engine.register_kind):
    the engine is handed in, not imported, since it imports the gate (through report.py)."""
    _declare[:] = [register_kind]


def instrument(name: str, trigger: "str | None" = None) -> bool:
    """Patch integration `name` if its installed versions are supported (else one warning per
    process tree, and False). Idempotent: it patches again only for a trigger module whose
    import it was not patched for (torchdata's after torch's: a module is in sys.modules
    while it runs, so what is imported is told by the hooks, not by sys.modules)."""
    integration, done = TABLE[name], _triggered.get(name)
    if done is not None and (trigger is None or trigger in done):
        return True
    reason = unsupported_reason(name)  # the installed versions' metadata: read once it matters
    if reason:
        from .. import log  # not at `import autoteardown`: each module imported costs its time

        log.warning_once("%s; %s are left alone", reason, integration.looks_after, tree=True)
        return False
    import importlib

    module: "Module" = importlib.import_module(f"{__name__}.{name}")
    for register_kind in _declare if name not in _patches else ():
        register_kind(integration.kind, integration.order, module.finalize_one, getattr(module, "after_all", None),
                      getattr(module, "in_child", None), getattr(module, "on_sigterm", None))
    from ..patches import Patches  # once a library is patched: not at `import autoteardown`

    module.patch(_patches.setdefault(name, Patches()))
    _triggered[name] = (done or frozenset()) | frozenset([trigger] if trigger else ())
    for later in integration.later:
        importhook.register(later, _LATER_HOOK)
    return True


def uninstrument(name: str) -> None:
    """Put back what integration `name` wrapped (by identity: only what is still ours), and
    remove its `later` hooks."""
    _triggered.pop(name, None)
    for later in TABLE[name].later:
        importhook.unregister(later, _LATER_HOOK)
    patches = _patches.pop(name, None)
    if patches is not None:
        patches.restore()


def patches_of(name: str) -> "Patches | None":
    """The Patches of integration `name` while it is instrumented (a wrap made at run time goes
    there, so that uninstrument puts it back), else None."""
    return _patches.get(name)


def on_later_import(module) -> None:
    """The post-import hook of every `later` trigger: its function, with the integration's Patches."""
    import importlib

    for name, integration in TABLE.items():
        target, patches = integration.later.get(module.__name__), _patches.get(name)
        if target is not None and patches is not None:
            submodule, _, function = target.partition(":")
            getattr(importlib.import_module(f"{__name__}.{submodule}"), function)(module, patches)


_LATER_HOOK = f"{__name__}:on_later_import"


def on_import(module) -> None:
    """The post-import hook of every trigger module: instrument the integration it triggers."""
    for name, integration in TABLE.items():
        if module.__name__ in integration.triggers:
            instrument(name, module.__name__)


def not_patched() -> "list[str]":
    """'name: owner.attribute' for each target an instrumented integration did not find."""
    return [f"{name}: {what}" for name, patches in _patches.items() for what in patches.missing]


def kind_of(module_name: str) -> str:
    """The resource kind of the integration module `module_name` (its __name__)."""
    return TABLE[module_name.rpartition(".")[2]].kind


def supported_range(name: str) -> str:
    """'wandb >=0.22,<0.32' (for doctor and the README)."""
    return ", ".join(map(str, TABLE[name].requires))


def get_version(name: str) -> "str | None":
    """The installed version of the integration's first installed distribution, or None."""
    return next(filter(None, (installed_version(r.distribution) for r in TABLE[name].requires)), None)


def unsupported_reason(name: str) -> "str | None":
    """None when every installed distribution of the integration is in its range, else why."""
    return next(filter(None, (check_version(r.distribution, r.minimum, r.below) for r in TABLE[name].requires)),
                None)


def recording(record):
    """A wrapt wrapper: call the original, then record(what it made: its result, or the
    instance an `__init__` set up); a failure to record is a debug line, never the user's."""
    def wrapper(wrapped, instance, args, kwargs):
        made = wrapped(*args, **kwargs)
        try:
            record(instance if getattr(wrapped, "__name__", None) == "__init__" else made)
        except Exception:
            from .. import log

            log.debug_exception("could not record what %r made", wrapped)
        return made

    wrapper.__module__ = record.__module__  # the integration's own wrapper, as the contract tests see it
    return wrapper


class OneEndAtATime:
    """A wrapt wrapper for a tracker's own end method (the one its finalize_one calls), and the
    lock finalize_one holds (`held`): the ends of one object run one at a time. The teardown can
    end an object from another thread while the program ends it (a SIGTERM's take-over,
    signals.py's rule 4, while the main thread still unwinds through a `finally: exp.end()` or
    Tune's callbacks). finalize_one checks and ends under the lock, so whichever comes second
    finds the object ended, instead of ending it again over the files the first has written and
    removed. Re-entrant: finalize_one's end takes it again. One for each integration module,
    made at its import (by one thread); a fork child inherits no end under way (the object is
    the parent's, and is ended there)."""

    def __init__(self) -> None:
        import weakref

        self.locks: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    def held(self, obj):
        """The object's lock (a context manager); a null one for an object that cannot be a weak key."""
        import _thread
        import contextlib

        try:
            lock = self.locks.get(obj)
            if lock is None:  # setdefault is atomic under the GIL: two first callers share one lock
                lock = self.locks.setdefault(obj, _thread.RLock())
        except TypeError:  # not weakly referable, or not hashable: as without us
            return contextlib.nullcontext()
        return lock

    def __call__(self, wrapped, instance, args, kwargs):
        with self.held(instance):
            return wrapped(*args, **kwargs)


def version_tuple(text: str) -> "tuple[int, ...]":
    """'2.13.0+cpu' -> (2, 13, 0), '2.0rc1' -> (2, 0): the release numbers, for range checks."""
    import re

    match = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(map(int, match.group().split("."))) if match else ()


def installed_version(distribution: str) -> "str | None":
    """The installed version of `distribution` (from its metadata: nothing is imported), or None."""
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_version(distribution: str, minimum: str, below: "str | None" = None) -> "str | None":
    """None when the installed `distribution` is within [minimum, below), else the reason."""
    found = installed_version(distribution)
    if found is None:
        return None  # not installed: nothing will be imported, nothing to patch
    version = version_tuple(found)
    if version < version_tuple(minimum) or (below and version >= version_tuple(below)):
        return f"{distribution} {found} is not supported (need >={minimum}" + (f",<{below}" if below else "") + ")"
    return None
