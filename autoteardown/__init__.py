"""autoteardown: make unmodified ML training scripts end cleanly. `import autoteardown`
is all it takes: post-import hooks patch each library when (if ever) it is imported,
and the exit engine finalizes what they recorded before the libraries' own exit hooks.

  importhook.py              post-import hooks: an integration is imported only with its library
  integrations/__init__.py   the integration table (triggers, supported versions) and Patches
  integrations/<name>.py     where a library is patched and its resources recorded
  registry.py                the weak registry of live resources; the first record arms the engine
  engine.py                  the exit engine: when, in what order, within what deadline
  signals.py                 SIGTERM, the one helper thread and its timers, ending a process early
  report.py, config.py,      the teardown report; the AUTOTEARDOWN_* variables;
  log.py                     stdlib logging, made on first use
  bootstrap/, cli/,          the sitecustomize that activates it; the command-line tools
  __main__.py                (`python -m autoteardown`)
"""

import sys

from . import config, engine, importhook, integrations, registry

__all__ = ["install", "uninstall", "finalize", "live", "ray_runtime_env_hook"]
__version__ = "0.1.0"


def install():
    """Patch each enabled integration when its library is imported (at once if it already
    is). Idempotent: a second import, a reload or a second call patches once."""
    if config.DISABLE:
        return
    registry.on_record = engine.arm  # armed at the first resource recorded
    for name, modules in integrations.TRIGGERS.items():
        if name in config.DISABLED_INTEGRATIONS:
            continue
        for module in modules:
            importhook.register(module, f"autoteardown.integrations.{name}:patch")


def uninstall():
    """Restore every patched original and stop watching imports."""
    importhook.clear()
    for name in integrations.TRIGGERS:
        module = sys.modules.get(f"autoteardown.integrations.{name}")
        if module is not None:
            module.unpatch()
    engine.disarm()


def finalize(timeout=None):
    """Finalize every recorded resource now (what the exit hook calls). Never raises."""
    engine.finalize(timeout)


def live():
    """What is recorded now: {kind: [objects]} for the resources still alive."""
    result = {}
    for kind, obj in registry.live():
        result.setdefault(kind, []).append(obj)
    return result


def ray_runtime_env_hook(runtime_env):
    """For RAY_RUNTIME_ENV_HOOK=autoteardown.ray_runtime_env_hook: every Ray job's
    workers get autoteardown (py_modules) and install it (worker_process_setup_hook)."""
    from .integrations.ray import runtime_env_hook

    return runtime_env_hook(runtime_env)


install()
