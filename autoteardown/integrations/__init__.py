"""The integrations, and the imports that trigger them.

Each integration is a module here with the same contract (as in ddtrace):
`patch()` (idempotent; patches what is imported now), `unpatch()`, and
`get_version()`. Its module is imported only when one of its target modules
is, through the post-import hooks set up by `autoteardown.install()`.
"""

TRIGGERS = {
    "torch": ("torch.utils.data", "torchdata.stateful_dataloader"),
    "distributed": ("torch.distributed",),
    "tensorboard": ("torch.utils.tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "ray": ("ray",),
    "mlflow": ("mlflow",),
}


def hook_name(integration):
    return f"autoteardown.integrations.{integration}:patch"


class Patches:
    """What an integration wrapped, so that its unpatch() can put it back."""

    def __init__(self):
        self._originals = {}  # (class or module, attribute name) -> the original

    def wrap(self, owner, name, wrapper):
        """Wrap owner.name with wrapt, once. False if already wrapped or missing."""
        import wrapt

        from .. import log

        if (owner, name) in self._originals or name not in vars(owner):
            return False
        self._originals[(owner, name)] = vars(owner)[name]
        wrapt.wrap_function_wrapper(owner, name, wrapper)
        log.debug("patched %s.%s", getattr(owner, "__qualname__", getattr(owner, "__name__", owner)), name)
        return True

    def restore(self):
        for (owner, name), original in self._originals.items():
            setattr(owner, name, original)
        self._originals.clear()

    def __bool__(self):
        return bool(self._originals)


def version_tuple(text):
    """'2.13.0+cpu' -> (2, 13, 0); good enough for range checks on release numbers."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = len(piece) - len(piece.lstrip("0123456789"))
        if not digits:
            break
        parts.append(int(piece[:digits]))
        if digits < len(piece):  # '0rc1': a pre-release of 0
            break
    return tuple(parts)


def check_version(distribution, minimum, below=None):
    """None when the installed `distribution` is within [minimum, below), else the reason."""
    import importlib.metadata

    try:
        found = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None  # not installed: nothing will be imported, nothing to patch
    version = version_tuple(found)
    if version < version_tuple(minimum) or (below and version >= version_tuple(below)):
        wanted = f">={minimum}" + (f",<{below}" if below else "")
        return f"{distribution} {found} is not supported (need {wanted})"
    return None
