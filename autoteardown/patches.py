"""Patches: what one owner wrapped, to be put back by identity (as ddtrace's `unwrap`).

Every patch of the package goes through a Patches: `wrap` (wrapt's
wrap_function_wrapper, once per attribute), `rebind` (one function bound under several
names), `replace` (a plain function where a wrapt proxy cannot go). `restore` puts back
only what is still ours. A target that is missing (a renamed private in a new release)
is a debug line and stays listed in `missing`, which the report shows: never silence.
"""

import sys

from . import log


class Patches:
    def __init__(self) -> None:
        self._patched: list[tuple] = []  # (class or module, attribute name, original, ours)
        self.missing: list[str] = []     # "owner.name" of each target that was not there

    def wrap(self, owner: object, name: str, wrapper) -> None:
        """Wrap owner.name (its own attribute, not an inherited one) with wrapt, once."""
        import wrapt

        self.replace(owner, name, lambda original: wrapt.FunctionWrapper(original, wrapper))

    def rebind(self, original, wrapper, package: str) -> None:
        """Wrap a function bound under several names (wandb.init is wandb.sdk.wandb_init.init):
        every attribute of a module of `package` that is `original` gets one FunctionWrapper."""
        if any(orig is original for _, _, orig, _ in self._patched):
            return
        import wrapt

        ours = wrapt.FunctionWrapper(original, wrapper)
        for module_name, module in list(sys.modules.items()):
            if module is None or not f"{module_name}.".startswith(f"{package}."):
                continue
            for name, value in list(vars(module).items()):
                if value is original:
                    setattr(module, name, ours)
                    self._patched.append((module, name, original, ours))
                    _debug("patched %s.%s", module, name)

    def replace(self, owner: object, name: str, make) -> None:
        """Set owner.name to make(original), once; `wrap` unless a wrapt proxy cannot go there
        (a method Ray pickles by reference)."""
        if name not in vars(owner):
            self._miss(owner, name)
            return
        if any(o is owner and n == name for o, n, _, _ in self._patched):
            return
        original = vars(owner)[name]
        ours = make(original)
        setattr(owner, name, ours)
        self._patched.append((owner, name, original, ours))
        _debug("patched %s.%s", owner, name)

    def restore(self) -> None:
        for owner, name, original, ours in reversed(self._patched):
            if vars(owner).get(name) is ours:
                setattr(owner, name, original)
            else:
                _debug("%s.%s was replaced after we wrapped it; left as it is", owner, name)
        self._patched.clear()
        self.missing.clear()

    def _miss(self, owner: object, name: str) -> None:
        what = f"{_name(owner)}.{name}"
        if what not in self.missing:
            self.missing.append(what)
            log.debug("not patched: %s has no %s (another release?)", _name(owner), name)


def _name(owner: object) -> str:
    return str(getattr(owner, "__qualname__", getattr(owner, "__name__", owner)))


def _debug(msg: str, owner: object, name: str) -> None:
    log.debug(msg, _name(owner), name)
