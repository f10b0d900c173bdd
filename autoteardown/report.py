"""The teardown report, for AUTOTEARDOWN_DEBUG=1 (stderr) and AUTOTEARDOWN_REPORT=path.jsonl
(one JSON line per process that recorded a resource). Imported by the engine only when
one is set; the engine catches what these raise. It calls header() once when armed, then per
teardown begin(trigger, code), step(kind, obj, outcome, seconds) per resource (obj None:
the kind's after-all step) and end(seconds, interrupted).
"""

import os
import sys
import time

from . import config, integrations, log
from ._version import __version__


class _State:
    """What this process reports: a fork child inherits it (its header is set again when it is armed,
    and `written` is a pid)."""

    def __init__(self) -> None:
        self.header: "dict | None" = None    # this process's header, once armed
        self.teardown: "dict | None" = None  # the teardown under way
        self.written: "int | None" = None    # the pid that already appended its JSON line


_state = _State()
_AFTER_ALL = {"wandb": "teardown, its exit hook run now (wandb-core writes out and stops)",
              "trackio": "its exit hook taken off (it would finish a run twice)"}


def header(activation=None):
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
    made = _state.header = {"version": __version__,
                            "python": sys.version.split()[0], "pid": os.getpid(),
                            "rank": int(rank) if rank and rank.isdigit() else rank,
                            "activation": activation or config.ACTIVATION, "config": config.summary(),
                            "argv": list(getattr(sys, "argv", []))[:4]}
    missing = integrations.not_patched()
    if missing:  # a target renamed in another release: that part of the integration does nothing
        made["not_patched"] = missing
        log.debug("not patched: %s", "; ".join(missing))
    settings = ", ".join(f"{k.removeprefix('AUTOTEARDOWN_').lower()}={v}" for k, v in made["config"].items()
                         if k not in ("AUTOTEARDOWN_DEBUG", "AUTOTEARDOWN_DISABLE"))
    log.debug("armed: autoteardown %s on Python %s, activated by %s; %s", made["version"], made["python"],
              made["activation"], settings)


def begin(trigger, code):
    # Wall clock, to line the teardown up with other processes' logs (Ray's, a launcher's).
    _state.teardown = {"trigger": trigger, "code": code, "started": round(time.time(), 3), "steps": []}
    log.debug("teardown started by %s; exit code handed on: %s", trigger, code)


def step(kind, obj, outcome, seconds):
    name = describe(kind, obj)
    teardown = _state.teardown
    if teardown is not None:
        teardown["steps"].append({"kind": kind, "resource": name, "outcome": outcome, "seconds": round(seconds, 4)})
    log.debug("  %s in %.3fs: %s %s", outcome, seconds, kind, name)


def end(seconds, interrupted=False):
    teardown, _state.teardown = _state.teardown, None
    if teardown is None:
        return
    import collections
    import json

    steps = teardown["steps"]
    counts = collections.Counter(s["outcome"].split(":")[0] for s in steps)
    log.debug("teardown %s in %.3fs: %s", "interrupted" if interrupted else "done", seconds,
              ", ".join(f"{n} {word}" for word, n in counts.items()) or "nothing to do")
    # One line per process: a later teardown that finds nothing to do adds none.
    if config.REPORT and (steps or _state.written != os.getpid()):
        line = dict(_state.header or {"pid": os.getpid()}, **teardown, seconds=round(seconds, 4),
                    **({"interrupted": True} if interrupted else {}))
        try:  # one write() of an O_APPEND file: the lines of ranks sharing it never interleave
            with open(config.REPORT, "ab", buffering=0) as f:
                f.write((json.dumps(line, default=str) + "\n").encode())
        except OSError as exc:
            log.warning_once("AUTOTEARDOWN_REPORT=%s cannot be written (%s); no report", config.REPORT,
                             exc.strerror or exc)
        _state.written = os.getpid()


def describe(kind, obj):
    """A short name the user recognises for a recorded resource; never raises."""
    if obj is None:
        return _AFTER_ALL.get(kind, "(for all)")
    try:
        name = next(n for n, row in integrations.TABLE.items() if row.kind == kind)
        name = __import__(f"autoteardown.integrations.{name}", fromlist=["describe"]).describe(obj)
    except Exception:
        name = None
    return name or type(obj).__name__
