"""Post-import hooks: run a function right after a module is first imported, or at once
if it already is, with the module (as wrapt's hooks are). A cut-down copy of wrapt's, whose import would cost every Python
process 50-80 ms in a sitecustomize. Hooks are "package.module:function" strings, so
an integration is imported only with its library; a hook never fails the user's import.
"""

import _thread
import sys
import time

from . import forksafe


class _State:
    """The hooks of this process; a fork child keeps them, with a new lock."""

    def __init__(self) -> None:
        self.lock = _thread.RLock()
        self.hooks: dict = {}          # module name -> list of "module:function" strings
        self.in_progress: set = set()  # names being looked up through the other finders


_state = _State()


def register(module_name: str, hook: str) -> None:
    """Call `hook` ("pkg.mod:func", given the module) once `module_name` is imported."""
    with _state.lock:
        hooks = _state.hooks.setdefault(module_name, [])
        if hook in hooks:
            return
        hooks.append(hook)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
    module = sys.modules.get(module_name)
    if module is not None:
        _call(hook, module)


def unregister(module_name: str, hook: str) -> None:
    """`hook` is no longer called when `module_name` is imported."""
    with _state.lock:
        hooks = _state.hooks.get(module_name, [])
        if hook in hooks:
            hooks.remove(hook)
        if not hooks:
            _state.hooks.pop(module_name, None)


def clear() -> None:
    with _state.lock:
        _state.hooks.clear()
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


def _call(hook, module):
    from . import log  # with the first library patched, not at `import autoteardown`

    try:
        started = time.perf_counter()
        module_name, _, function = hook.partition(":")
        __import__(module_name)
        getattr(sys.modules[module_name], function)(module)
        log.debug("%s imported: %s took %.1f ms", module.__name__, hook, (time.perf_counter() - started) * 1e3)
    except Exception as exc:
        log.warning("could not apply %s when %s was imported: %s: %s%s", hook, module.__name__, type(exc).__name__,
                    exc, "" if log.is_debug() else " (set AUTOTEARDOWN_DEBUG=1 for the traceback)")
        log.debug_exception("hook %s failed", hook)


class _Finder:
    """A sys.meta_path finder that finds nothing itself: for a watched module it asks
    the other finders for the spec, then wraps the loader to call the hooks."""

    def find_spec(self, fullname, path=None, target=None):
        with _state.lock:
            if fullname not in _state.hooks or fullname in _state.in_progress:
                return None
            _state.in_progress.add(fullname)
        try:
            finders = (f for f in sys.meta_path if f is not self and hasattr(f, "find_spec"))
            spec = next(filter(None, (f.find_spec(fullname, path, target) for f in finders)), None)
            if spec is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
            return spec
        finally:
            with _state.lock:
                _state.in_progress.discard(fullname)


class _Loader:
    """Delegates to the real loader, then calls the hooks once the module has run."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # create_module and the rest
        return getattr(self._loader, name)

    def exec_module(self, module):
        # Give the module its real loader back (importlib.resources and friends use it).
        if getattr(module, "__loader__", None) in (None, self):
            module.__loader__ = self._loader
        if getattr(module.__spec__, "loader", None) is self:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        with _state.lock:
            hooks = list(_state.hooks.get(module.__name__, ()))
        for hook in hooks:
            _call(hook, module)


_FINDER = _Finder()


def _after_fork_in_child() -> None:
    _state.lock = _thread.RLock()  # another thread may have held it at the fork (an import)


forksafe.register(__name__, _after_fork_in_child)
