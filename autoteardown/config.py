"""Configuration, read once from the environment. A bad value never raises: it gets the
default and one warning per process tree (children inherit the value and stay quiet).
"""

import os
import sys

from .integrations import TABLE

MAX_SECONDS = 3600.0  # a longer teardown is a hang by another name (and overflows lock timeouts)


def _warn(msg, *args):
    from . import log  # only for a bad value: each module imported costs `import autoteardown` time

    log.warning_once(msg, *args, tree=True)


def _flag(name, default=False):
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw not in ("", "0", "false", "no", "off"):
        _warn("%s=%r is not a boolean (use 1 or 0); using %d", name, raw, default)
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
        _warn("%s=%r is not a positive number of seconds%s; using %g", name, raw,
              f" up to {MAX_SECONDS:g}" if value > MAX_SECONDS else "", default)
        return default
    return value


def _integrations(name):
    raw = os.environ.get(name, "").strip()
    if raw == "*":
        return set(TABLE)
    names = {part.strip().lower() for part in raw.split(",") if part.strip()}
    unknown = sorted(names - set(TABLE))
    if unknown:
        _warn("%s: unknown integration(s) %s ignored (known: %s)", name, ", ".join(unknown), ", ".join(TABLE))
    return names & set(TABLE)


def _activation():
    """How autoteardown came to be imported here, for the debug line and the report: worked
    out only when one of them will say it (the stack is only there now, at the import), since
    reading it costs a module at every `import autoteardown`."""
    if not (DEBUG or REPORT):
        return None
    from . import cpython

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
if DEBUG:  # log.py's own default is off
    from . import log

    log.set_debug(True)
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
