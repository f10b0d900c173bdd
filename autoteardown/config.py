"""Configuration, read once from the environment.

A bad value never raises: it gets one warning and the default.
"""

import os

from . import log

INTEGRATIONS = ("torch", "distributed", "tensorboard", "wandb", "ray", "mlflow")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _flag(name, default=False):
    raw = os.environ.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return default
    log.warning("%s=%r is not a boolean (use 1 or 0); using %d", name, raw, default)
    return default


def _seconds(name, default):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        log.warning("%s=%r is not a positive number of seconds; using %g", name, raw, default)
        return default
    return value


def _integrations(name):
    raw = os.environ.get(name, "").strip()
    if raw == "*":
        return set(INTEGRATIONS)
    names = {part.strip().lower() for part in raw.split(",") if part.strip()}
    unknown = sorted(names - set(INTEGRATIONS))
    if unknown:
        log.warning("%s: unknown integration(s) %s ignored (known: %s)",
                    name, ", ".join(unknown), ", ".join(INTEGRATIONS))
    return names & set(INTEGRATIONS)


DEBUG = _flag("AUTOTEARDOWN_DEBUG")
log.set_debug(DEBUG)
DISABLE = _flag("AUTOTEARDOWN_DISABLE")
DISABLED_INTEGRATIONS = _integrations("AUTOTEARDOWN_DISABLED_INTEGRATIONS")
TIMEOUT = _seconds("AUTOTEARDOWN_TIMEOUT", 10.0)
RAY_GRACE = _seconds("AUTOTEARDOWN_RAY_GRACE_S", 5.0)  # as Ray Train's graceful-shutdown wait


def summary():
    """The config in effect, for `python -m autoteardown doctor` and debug output."""
    return {
        "AUTOTEARDOWN_DISABLE": DISABLE,
        "AUTOTEARDOWN_DISABLED_INTEGRATIONS": sorted(DISABLED_INTEGRATIONS),
        "AUTOTEARDOWN_TIMEOUT": TIMEOUT,
        "AUTOTEARDOWN_DEBUG": DEBUG,
        "AUTOTEARDOWN_RAY_GRACE_S": RAY_GRACE,
    }
