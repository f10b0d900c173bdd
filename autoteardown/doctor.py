"""`python -m autoteardown doctor`: what autoteardown would do in this environment."""

import importlib
import importlib.metadata
import sys

from . import __version__, config, integrations

PACKAGES = ("wrapt", "psutil", "torch", "torchdata", "tensorboard", "tensorboardX", "wandb", "ray")


def installed_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def doctor():
    print(f"autoteardown {__version__} on Python {sys.version.split()[0]}")
    print("\npackages:")
    for name in PACKAGES:
        print(f"  {name:<13} {installed_version(name) or '-'}")
    print("\nintegrations:")
    for name in integrations.TRIGGERS:
        try:
            module = importlib.import_module(f"autoteardown.integrations.{name}")
        except ImportError as exc:
            print(f"  {name:<12} unavailable: {exc}")
            continue
        supported = getattr(module, "SUPPORTED", "")
        problem = module.unsupported_reason() if hasattr(module, "unsupported_reason") else None
        if config.DISABLE or name in config.DISABLED_INTEGRATIONS:
            state = "disabled by config"
        elif problem:
            state = f"will NOT patch: {problem}"
        else:
            state = "will patch when imported"
        print(f"  {name:<12} {state}  (supports {supported})")
    print("\nconfig:")
    for key, value in config.summary().items():
        print(f"  {key} = {value}")
    return 0
