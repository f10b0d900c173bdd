"""`autoteardown doctor`: what autoteardown would do in this environment (integrations.TABLE)."""

import importlib.util
import os
import subprocess
import sys

from .. import __version__, config
from ..integrations import TABLE, installed_version, supported_range, unsupported_reason
from . import pythonpath_entries

PACKAGES = ("wrapt", "psutil") + tuple(dict.fromkeys(r.distribution for row in TABLE.values() for r in row.requires))


def _version(name):
    found = installed_version(name)
    if found is None and name == "psutil":  # Ray ships its own copy, which `import ray` puts on sys.path
        bundled = _bundled_with_ray(name)
        found = bundled and f"{bundled} (bundled with ray)"
    return found


def _bundled_with_ray(name):
    try:
        folder = os.path.join(os.path.dirname(importlib.util.find_spec("ray").origin), "thirdparty_files")
        return next(e[len(name) + 1:-len(".dist-info")] for e in os.listdir(folder)
                    if e.startswith(f"{name}-") and e.endswith(".dist-info"))
    except Exception:
        return None


def active_here():
    """Whether a plain `python` started from here (this environment, this PYTHONPATH)
    runs with autoteardown, and how."""
    code = ("import sys; m = sys.modules.get('autoteardown'); "
            "print(getattr(getattr(m, 'config', None), 'ACTIVATION', 'an unknown route') if m else '-')")
    env = dict(os.environ, AUTOTEARDOWN_DEBUG="1")  # the route is worked out for the debug line
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
        print(f"  {name:<13} {_version(name) or 'not installed'}")
    print("\nintegrations:")
    for name, row in TABLE.items():
        if config.DISABLE or name in config.DISABLED_INTEGRATIONS:
            state = "disabled by config"
        elif not any(installed_version(r.distribution) for r in row.requires):
            state = "not installed"
        else:
            problem = unsupported_reason(name)
            state = (f"will NOT patch: {problem}" if problem else "will patch when imported") + (
                f"  (supports {supported_range(name)})")
        print(f"  {name:<12} {state}")
    print("\nconfig:")
    for key, value in config.summary().items():
        print(f"  {key} = {value}")
    return 0
