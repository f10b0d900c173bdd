"""Cluster-wide activation: RAY_RUNTIME_ENV_HOOK=autoteardown.ray_runtime_env_hook.

Every job whose driver calls `ray.init` with it set ships autoteardown to its workers
(py_modules) and installs it there (worker_process_setup_hook). wrapt ships too: Ray does not
depend on it, and without it every patch in the workers fails; where its C extension does not
load (another Python), wrapt falls back to its pure-Python wrappers.
"""

import importlib.util
import os

_OURS = ("autoteardown.install", "autoteardown.integrations.ray.setup_hook")


def load_class(path):
    """Ray's own loader for "module.attr" hook names (ray._private.utils -> ray._common.utils in 2.4x)."""
    try:
        from ray._common.utils import load_class as loader
    except ImportError:
        from ray._private.utils import load_class as loader
    return loader(path)


def shipped_packages():
    """Directories to put in py_modules: autoteardown, and wrapt if this Python has it."""
    packages = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    spec = importlib.util.find_spec("wrapt")  # found, not imported: this runs in every ray.init
    if spec is not None and spec.origin:
        packages.append(os.path.dirname(spec.origin))
    return packages


def runtime_env_hook(runtime_env):
    """The shim's runtime_env, chaining AUTOTEARDOWN_NEXT_RUNTIME_ENV_HOOK and any setup hook already set."""
    runtime_env = dict(runtime_env or {})
    following = os.environ.get("AUTOTEARDOWN_NEXT_RUNTIME_ENV_HOOK")
    if following:
        runtime_env = dict(load_class(following)(runtime_env) or {})
    modules = list(runtime_env.get("py_modules") or [])
    names = {os.path.basename(str(m).rstrip("/")) for m in modules}
    for package in shipped_packages():
        if package not in modules and os.path.basename(package) not in names:
            modules.append(package)
    runtime_env["py_modules"] = modules
    existing = runtime_env.get("worker_process_setup_hook")
    if existing is None or existing in _OURS:
        runtime_env["worker_process_setup_hook"] = existing or "autoteardown.install"
    elif isinstance(existing, str):
        env_vars = dict(runtime_env.get("env_vars") or {})
        env_vars["AUTOTEARDOWN_NEXT_SETUP_HOOK"] = existing
        runtime_env["env_vars"] = env_vars
        runtime_env["worker_process_setup_hook"] = "autoteardown.integrations.ray.setup_hook"
    else:
        runtime_env["worker_process_setup_hook"] = _chain_setup_hook(existing)
    return runtime_env


def setup_hook():
    """Install autoteardown, then run the worker_process_setup_hook this replaced."""
    import autoteardown

    autoteardown.install()
    following = os.environ.get("AUTOTEARDOWN_NEXT_SETUP_HOOK")
    if following:
        load_class(following)()


def _chain_setup_hook(following):
    def setup_then_following():
        import autoteardown

        autoteardown.install()
        following()

    return setup_then_following
