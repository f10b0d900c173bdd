"""Configuration, read once from the environment. A bad value never raises: it gets the
default and one warning per process tree (children inherit the value and stay quiet).
"""

import os
import sys

from . import cpython, log
from .integrations import TABLE

MAX_SECONDS = 3600.0  # a longer teardown is a hang by another name (and overflows lock timeouts)


def _flag(name, default=False):
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw not in ("", "0", "false", "no", "off"):
        log.warning_once("%s=%r is not a boolean (use 1 or 0); using %d", name, raw, default, tree=True)
    return default


def _seconds(name, default):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_SECONDS:
        log.warning_once("%s=%r is not a positive number of seconds%s; using %g", name, raw,
                         f" up to {MAX_SECONDS:g}" if value > MAX_SECONDS else "", default, tree=True)
        return default
    return value


def _integrations(name):
    raw = os.environ.get(name, "").strip()
    if raw == "*":
        return set(TABLE)
    names = {part.strip().lower() for part in raw.split(",") if part.strip()}
    unknown = sorted(names - set(TABLE))
    if unknown:
        log.warning_once("%s: unknown integration(s) %s ignored (known: %s)",
                         name, ", ".join(unknown), ", ".join(TABLE), tree=True)
    return names & set(TABLE)


def _activation():
    """How autoteardown came to be imported here, for the debug line and the report."""
    if cpython.importing("sitecustomize"):
        return os.environ.get("AUTOTEARDOWN_INTERNAL_VIA") or "sitecustomize"  # set by `autoteardown run`
    if os.path.basename(sys.argv[0] if sys.argv else "") in ("autoteardown", "autoteardown-run", "-m"):
        return "cli"  # the command itself (`-m`: python -m autoteardown, while it is being found)
    startup, frame = os.environ.get("PYTHONSTARTUP"), cpython.caller()
    while frame is not None:
        if f"{os.sep}ray{os.sep}_private{os.sep}" in frame.f_code.co_filename:
            return "Ray hook"
        if startup and frame.f_code.co_filename == startup:
            return "PYTHONSTARTUP"
        frame = frame.f_back
    return "import"


DEBUG = _flag("AUTOTEARDOWN_DEBUG")
log.set_debug(DEBUG)
DISABLE = _flag("AUTOTEARDOWN_DISABLE")
DISABLED_INTEGRATIONS = _integrations("AUTOTEARDOWN_DISABLED_INTEGRATIONS")
TIMEOUT = _seconds("AUTOTEARDOWN_TIMEOUT", 10.0)
RAY_GRACE = _seconds("AUTOTEARDOWN_RAY_GRACE_S", 5.0)  # as Ray Train's graceful-shutdown wait
REPORT = os.environ.get("AUTOTEARDOWN_REPORT", "").strip() or None
ACTIVATION = _activation()
if DEBUG and ACTIVATION != "cli":
    log.debug("AUTOTEARDOWN_DISABLE=1: imported (via %s) but doing nothing in this process" if DISABLE
              else "active in this process (via %s)", ACTIVATION)


def summary():
    """The config in effect, for `autoteardown doctor` and the teardown report."""
    return {"AUTOTEARDOWN_DISABLE": DISABLE, "AUTOTEARDOWN_DISABLED_INTEGRATIONS": sorted(DISABLED_INTEGRATIONS),
            "AUTOTEARDOWN_TIMEOUT": TIMEOUT, "AUTOTEARDOWN_DEBUG": DEBUG, "AUTOTEARDOWN_RAY_GRACE_S": RAY_GRACE,
            "AUTOTEARDOWN_REPORT": REPORT}
