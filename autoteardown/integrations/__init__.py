"""The integration table, and the contract every integration module keeps.

Each module keeps ddtrace's contract: `patch()` (idempotent; returns at once unless
`supported(NAME)`), `unpatch()` (restores by identity), `get_version()`, and `describe(obj)`
for the report. It is imported only when one of its trigger modules is.
"""

import sys

from .. import log

# name: (resource kind, trigger modules, what it looks after (for the warning when it is off),
#        (distribution, minimum, below)...), where an installed distribution must lie in [minimum, below).
TABLE = {
    "torch": ("dataloader", ("torch.utils.data", "torchdata.stateful_dataloader"), "DataLoader workers",
              ("torch", "2.0", None), ("torchdata", "0.8", None)),
    "distributed": ("process_group", ("torch.distributed",), "process groups", ("torch", "2.0", None)),
    "tensorboard": ("tensorboard", ("torch.utils.tensorboard", "tensorboardX"), "SummaryWriters",
                    ("tensorboard", "2.0", None), ("tensorboardX", "2.0", None)),
    "wandb": ("wandb", ("wandb",), "wandb runs", ("wandb", "0.22", "0.32")),
    "ray": ("ray", ("ray",), "Ray actors", ("ray", "2.40", "2.61")),
    # mlflow-skinny provides the same `mlflow` package, without the server.
    "mlflow": ("mlflow", ("mlflow",), "mlflow runs", ("mlflow", "2.10", "4"), ("mlflow-skinny", "2.10", "4")),
    # Both rely on private names of the releases their modules name as tested.
    "swanlab": ("swanlab", ("swanlab",), "swanlab runs", ("swanlab", "0.9.8", "0.11")),
    "trackio": ("trackio", ("trackio",), "trackio runs", ("trackio", "0.40", "0.44")),
}
TRIGGERS = {name: row[1] for name, row in TABLE.items()}


def supported_range(name):
    """'wandb >=0.22,<0.32' (for doctor and the README)."""
    return ", ".join(f"{dist} >={low}" + (f",<{high}" if high else "") for dist, low, high in TABLE[name][3:])


def get_version(name):
    """The installed version of the integration's first installed distribution, or None."""
    return next(filter(None, (installed_version(dist) for dist, _, _ in TABLE[name][3:])), None)


def unsupported_reason(name):
    """None when every installed distribution of the integration is in its range, else why."""
    return next(filter(None, (check_version(*row) for row in TABLE[name][3:])), None)


def contract(name, patches):
    """ddtrace's get_version() and unpatch() for integration `name` (unpatch: patches.restore())."""
    return (lambda: get_version(name)), patches.restore


def supported(name):
    """True if `name` may patch; otherwise one warning per process tree, and False."""
    reason = unsupported_reason(name)
    if reason:
        log.warning_once("%s; %s are left alone", reason, TABLE[name][2], tree=True)
    return reason is None


def recording(record):
    """A wrapt wrapper: call the original, then record(what it made: its result, or the
    instance an `__init__` set up); a failure to record is a debug line, never the user's."""
    def wrapper(wrapped, instance, args, kwargs):
        made = wrapped(*args, **kwargs)
        try:
            record(instance if getattr(wrapped, "__name__", None) == "__init__" else made)
        except Exception:
            log.debug_exception("could not record what %r made", wrapped)
        return made

    wrapper.__module__ = record.__module__  # the integration's own wrapper, as unpatch() sees it
    return wrapper


def exit_unless_stopped(wrapped, instance, args, kwargs):
    """A run's `__exit__` in our SIGTERM unwind: the teardown ends the run, with the signal's status."""
    if sys.modules["autoteardown.engine"].is_stop(args[1] if len(args) > 1 else kwargs.get("exc_val")):
        return False
    return wrapped(*args, **kwargs)


class Patches:
    """What an integration wrapped, for its unpatch() to put back by identity (as ddtrace's `unwrap`)."""

    def __init__(self):
        self._patched = []  # (class or module, attribute name, original, our wrapper)

    def wrap(self, owner, name, wrapper):
        """Wrap owner.name (its own attribute, if it has it) with wrapt, once."""
        import wrapt

        if name not in vars(owner) or any(o is owner and n == name for o, n, _, _ in self._patched):
            return
        original = vars(owner)[name]
        wrapt.wrap_function_wrapper(owner, name, wrapper)
        self._patched.append((owner, name, original, vars(owner)[name]))
        _debug("patched %s.%s", owner, name)

    def rebind(self, original, wrapper, package):
        """Wrap a function bound under several names (wandb.init is wandb.sdk.wandb_init.init):
        every attribute of a module of `package` that is `original` gets one FunctionWrapper."""
        import wrapt

        if any(orig is original for _, _, orig, _ in self._patched):
            return
        ours = wrapt.FunctionWrapper(original, wrapper)
        for module_name, module in list(sys.modules.items()):
            if module is None or not f"{module_name}.".startswith(f"{package}."):
                continue
            for name, value in list(vars(module).items()):
                if value is original:
                    setattr(module, name, ours)
                    self._patched.append((module, name, original, ours))
                    _debug("patched %s.%s", module, name)

    def restore(self):
        for owner, name, original, ours in reversed(self._patched):
            if vars(owner).get(name) is ours:
                setattr(owner, name, original)
            else:
                _debug("%s.%s was replaced after we wrapped it; left as it is", owner, name)
        self._patched.clear()

    def __bool__(self):
        return bool(self._patched)


def _debug(msg, owner, name):
    log.debug(msg, getattr(owner, "__qualname__", getattr(owner, "__name__", owner)), name)


def version_tuple(text):
    """'2.13.0+cpu' -> (2, 13, 0), '2.0rc1' -> (2, 0): the release numbers, for range checks."""
    import re

    match = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(map(int, match.group().split("."))) if match else ()


def installed_version(distribution):
    """The installed version of `distribution` (from its metadata: nothing is imported), or None."""
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_version(distribution, minimum, below=None):
    """None when the installed `distribution` is within [minimum, below), else the reason."""
    found = installed_version(distribution)
    if found is None:
        return None  # not installed: nothing will be imported, nothing to patch
    version = version_tuple(found)
    if version < version_tuple(minimum) or (below and version >= version_tuple(below)):
        return f"{distribution} {found} is not supported (need >={minimum}" + (f",<{below}" if below else "") + ")"
    return None
