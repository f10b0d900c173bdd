"""`autoteardown doctor`: what autoteardown would do in this environment."""

import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys

from . import __version__, config, integrations
from .bootstrap import pythonpath_entries

PACKAGES = ("wrapt", "psutil", "torch", "torchdata", "tensorboard", "tensorboardX", "wandb", "ray", "mlflow")
# The top-level modules an integration's library installs (looked up without importing them).
LIBRARIES = {"torch": ("torch",), "distributed": ("torch",), "tensorboard": ("tensorboard", "tensorboardX"),
             "wandb": ("wandb",), "ray": ("ray",), "mlflow": ("mlflow",)}


def installed_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
    if name == "psutil":  # Ray ships its own copy, which `import ray` puts on sys.path
        bundled = _bundled_with_ray("psutil")
        if bundled:
            return f"{bundled} (bundled with ray)"
    return None


def _bundled_with_ray(name):
    try:
        ray = importlib.util.find_spec("ray")
        folder = os.path.join(os.path.dirname(ray.origin), "thirdparty_files")
        for entry in os.listdir(folder):
            if entry.startswith(f"{name}-") and entry.endswith(".dist-info"):
                return entry[len(name) + 1:-len(".dist-info")]
    except Exception:
        pass
    return None


def _installed(modules):
    for module in modules:
        try:
            if importlib.util.find_spec(module) is not None:
                return True
        except (ImportError, ValueError):
            pass
    return False


def active_here():
    """Whether a plain `python` started from here (this environment, this PYTHONPATH)
    runs with autoteardown, and how."""
    code = ("import sys; m = sys.modules.get('autoteardown'); "
            "print(getattr(getattr(m, 'config', None), 'ACTIVATION', 'an unknown route') if m else '-')")
    env = {k: v for k, v in os.environ.items() if k != "AUTOTEARDOWN_DEBUG"}
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
        answer = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "-"
    except Exception as exc:
        return f"could not tell ({exc})"
    if answer == "-":
        return "no: a `python` started here does not import autoteardown (see below)"
    return f"yes, through {answer}"


def doctor():
    print(f"autoteardown {__version__} on Python {sys.version.split()[0]} ({sys.executable})")
    print(f"\nactive for `python` here: {active_here()}")
    entries = os.pathsep.join(pythonpath_entries())
    print(f"  bootstrap sitecustomize: {entries}")
    print("  to activate without changing a script: autoteardown run python train.py")
    print(f"                                     or: PYTHONPATH={entries} python train.py")
    print("\npackages:")
    for name in PACKAGES:
        print(f"  {name:<13} {installed_version(name) or 'not installed'}")
    print("\nintegrations:")
    for name in integrations.TRIGGERS:
        if config.DISABLE or name in config.DISABLED_INTEGRATIONS:
            print(f"  {name:<12} disabled by config")
            continue
        if not _installed(LIBRARIES.get(name, (name,))):
            print(f"  {name:<12} not installed")
            continue
        try:
            module = importlib.import_module(f"autoteardown.integrations.{name}")
        except ImportError as exc:
            print(f"  {name:<12} unavailable: {exc}")
            continue
        supported = getattr(module, "SUPPORTED", "")
        problem = module.unsupported_reason() if hasattr(module, "unsupported_reason") else None
        state = f"will NOT patch: {problem}" if problem else "will patch when imported"
        print(f"  {name:<12} {state}" + (f"  (supports {supported})" if supported else ""))
    print("\nconfig:")
    for key, value in config.summary().items():
        print(f"  {key} = {value}")
    return 0
