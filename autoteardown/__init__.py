"""autoteardown: make unmodified ML training scripts end cleanly. `import autoteardown`
is all it takes: post-import hooks patch each library when (if ever) it is imported,
and the exit engine finalizes what they recorded before the libraries' own exit hooks.

  importhook.py              post-import hooks: an integration is imported only with its library
  integrations/__init__.py   the integration table and the one gate (instrument/uninstrument)
  integrations/<name>.py     what a library's patch wraps, how its resources are finalized
  patches.py                 what was wrapped, put back by identity
  registry.py                the weak registry of live resources; the first record arms the engine
  engine.py                  the exit engine: when, in what order, within what deadline
  exitstatus.py              how the process is ending: the exit status handed on
  signals.py                 SIGTERM: its state, the handler, the unwind, ending a process early
  threads.py                 the runner threads and the one helper thread with its timers
  forksafe.py                the one after-fork hook, each module's reset in a stated order
  cpython.py                 every use of CPython's private internals, in one place
  report.py, config.py,      the teardown report; the AUTOTEARDOWN_* variables;
  log.py                     stdlib logging, made on first use
  bootstrap/, cli/,          the sitecustomize that activates it; the command-line tools
  __main__.py                (`python -m autoteardown`)
"""

from . import config, importhook, integrations

__all__ = ["install", "uninstall", "finalize", "live", "ray_runtime_env_hook", "__version__"]


def __getattr__(name: str) -> str:
    if name == "__version__":  # read on demand: each module imported costs `import autoteardown` time
        from ._version import __version__

        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install() -> None:
    """Patch each enabled integration when its library is imported (at once if it already
    is). Idempotent: a second import, a reload or a second call patches once. The engine is
    imported when a library is first patched, and armed at its first record: most processes
    do neither."""
    if config.DISABLE:
        return
    integrations.declare_kinds_to(_register_kind)
    for name, integration in integrations.TABLE.items():
        if name not in config.DISABLED_INTEGRATIONS:
            for module in integration.triggers:
                importhook.register(module, "autoteardown.integrations:on_import")


def uninstall() -> None:
    """Restore every patched original and stop watching imports."""
    importhook.clear()
    for name in integrations.TABLE:
        integrations.uninstrument(name)
    from . import engine

    engine.disarm()


def finalize(timeout: "float | None" = None) -> None:
    """Finalize every recorded resource now (what the exit hook calls), within `timeout`
    seconds (AUTOTEARDOWN_TIMEOUT by default). A KeyboardInterrupt or SystemExit that
    interrupts the wait stops the teardown (the rest stays recorded) and is raised again."""
    from . import engine

    engine.finalize(timeout)


def _register_kind(*args) -> None:
    from . import engine

    engine.register_kind(*args)


def live() -> "dict[str, list]":
    """What is recorded now: {kind: [objects]} for the resources still alive."""
    from . import registry

    result: "dict[str, list]" = {}
    for kind, obj in registry.live():
        result.setdefault(kind, []).append(obj)
    return result


def ray_runtime_env_hook(runtime_env: dict) -> dict:
    """For RAY_RUNTIME_ENV_HOOK=autoteardown.ray_runtime_env_hook: every Ray job's
    workers get autoteardown (py_modules) and install it (worker_process_setup_hook)."""
    from .integrations.ray import runtime_env_hook

    return runtime_env_hook(runtime_env)


install()
