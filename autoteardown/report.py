"""The teardown report: what the exit engine did in this process, in words a user
recognises, for AUTOTEARDOWN_DEBUG=1 (on stderr, through log.py, so every line
carries the pid and rank) and AUTOTEARDOWN_REPORT=path.jsonl (one JSON line per
process, appended, for CI systems).

Imported by the engine only when one of the two is set. Stdlib only; nothing here
raises: a report that cannot be made is a debug line, never an error.

The engine calls, in this order:
    header(activation=None)       once per process, when it is armed (default: config.ACTIVATION)
    begin(trigger, code)          a teardown starts: what triggered it, the exit code handed on
    step(kind, obj, outcome, s)   one per resource (obj None: the kind's after-all step)
    end(seconds)                  the teardown is over
"""

import os
import sys
import time

from . import config, log

TRIGGERS = ("normal end", "exception", "sys.exit(n)", "SIGTERM", "Ray exit", "ray.shutdown", "finalize()")

_header = None     # this process's header (dict), once armed
_teardown = None   # the teardown under way: {"trigger", "code", "steps": [...]}
_written = None    # pid that already appended its JSON line


def _safe(func):
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception:
            log.debug_exception("teardown report: %s failed", func.__name__)
    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


def _rank():
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
    return int(rank) if rank and rank.isdigit() else rank


@_safe
def header(activation=None):
    global _header
    activation = activation or config.ACTIVATION
    _header = {
        "version": getattr(sys.modules.get("autoteardown"), "__version__", None),
        "python": sys.version.split()[0],
        "pid": os.getpid(),
        "rank": _rank(),
        "activation": activation,
        "config": config.summary(),
        "argv": list(getattr(sys, "argv", []))[:4],
    }
    settings = ", ".join(f"{k.replace('AUTOTEARDOWN_', '').lower()}={v}" for k, v in config.summary().items()
                         if k not in ("AUTOTEARDOWN_DEBUG", "AUTOTEARDOWN_DISABLE"))
    log.debug("armed: autoteardown %s on Python %s, activated by %s; %s",
              _header["version"], _header["python"], activation, settings)


@_safe
def begin(trigger, code):
    global _teardown
    _teardown = {"trigger": trigger, "code": code, "started": time.time(), "steps": []}
    log.debug("teardown started by %s; exit code handed on: %s", trigger, code)


@_safe
def step(kind, obj, outcome, seconds):
    name = describe(kind, obj)
    if _teardown is not None:
        _teardown["steps"].append({"kind": kind, "resource": name, "outcome": outcome,
                                   "seconds": round(seconds, 4)})
    log.debug("  %s in %.3fs: %s %s", outcome, seconds, kind, name)


@_safe
def end(seconds):
    global _teardown, _written
    teardown, _teardown = _teardown, None
    steps = teardown["steps"] if teardown else []
    counts = {}
    for s in steps:
        word = s["outcome"].split(":")[0]
        counts[word] = counts.get(word, 0) + 1
    summary = ", ".join(f"{n} {word}" for word, n in counts.items()) or "nothing to do"
    log.debug("teardown done in %.3fs: %s", seconds, summary)
    path = config.REPORT
    # One line per process: a second teardown (finalize() and then the exit) that found
    # nothing to do adds nothing.
    if path and teardown is not None and (steps or _written != os.getpid()):
        line = dict(_header or {"pid": os.getpid(), "rank": _rank()})
        line.update(trigger=teardown["trigger"], code=teardown["code"], seconds=round(seconds, 4), steps=steps)
        _append(path, line)
        _written = os.getpid()


def _append(path, line):
    import json

    text = json.dumps(line, default=str) + "\n"
    # One write() of an O_APPEND file: the lines of ranks sharing the file never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# ---- naming resources --------------------------------------------------------

_AFTER_ALL = {"wandb": "wandb.teardown() (wandb-core writes out and stops)"}
_EXITCODE_WORDS = {0: "stopped", -15: "ended by SIGTERM", -9: "killed (SIGKILL)"}


def describe(kind, obj):
    """A short name the user recognises for a recorded resource; never raises."""
    if obj is None:
        return _AFTER_ALL.get(kind, "(for all)")
    try:
        from .engine import describers

        describe_ = describers.get(kind) or _DESCRIBE.get(kind)
        name = describe_(obj) if describe_ else None
    except Exception:
        name = None
    return name or type(obj).__name__


def _dataloader(it):
    workers = list(getattr(it, "_workers", None) or ())
    loader = "StatefulDataLoader" if "Stateful" in type(it).__name__ else "DataLoader"
    if not workers:
        return f"{loader} (no workers)"
    states = []
    for w in workers:
        try:
            code = w.exitcode  # None while alive; only the parent can ask
        except Exception:
            code = None
        states.append(None if code is None else _EXITCODE_WORDS.get(code, f"exit {code}"))
    pids = ", ".join(str(w.pid) for w in workers)
    text = f"{loader} with {len(workers)} worker(s) (pid {pids}"
    if len(set(states)) == 1 and states[0] is not None:
        text += f": {states[0]}"
    elif any(states):
        text = f"{loader} with {len(workers)} worker(s) (" + ", ".join(
            f"pid {w.pid}: {state or 'running'}" for w, state in zip(workers, states))
    return text + ")"


def _wandb(run):
    # Private attributes only: in a fork child the public properties talk to the parent's run.
    settings = getattr(run, "_settings", None)
    run_id = getattr(run, "_run_id", None) or getattr(settings, "run_id", None)
    name = getattr(settings, "run_name", None)
    project = getattr(settings, "project", None)
    text = f"run {run_id}" if run_id else "run"
    if name:
        text += f" ({name!s})"
    if project:
        text += f" in project {project}"
    return text


def _ray(obj):
    if hasattr(obj, "actor_id") and hasattr(obj, "pid"):  # an actor told to end, being watched
        return f"terminated actor {str(obj.actor_id)[:8]} (pid {obj.pid})"
    descriptor = getattr(obj, "_ray_actor_creation_function_descriptor", None)
    cls = getattr(descriptor, "class_name", None)
    actor_id = getattr(obj, "_ray_actor_id", None)
    if descriptor is None and actor_id is None:
        return None
    short = actor_id.hex()[:8] if actor_id is not None else "?"
    return f"actor {cls or 'Actor'} {short}"


def _process_group(group):
    return f"{group.name()} group of {group.size()} rank(s)"


def _tensorboard(writer):
    log_dir = getattr(writer, "log_dir", None) or writer.get_logdir()
    return f"SummaryWriter {log_dir}"


def _mlflow(obj):
    info = getattr(obj, "info", None)
    run_id = getattr(info, "run_id", None) or getattr(obj, "run_id", None) or (obj if isinstance(obj, str) else None)
    name = getattr(info, "run_name", None)
    return (f"run {run_id}" + (f" ({name})" if name else "")) if run_id else None


_DESCRIBE = {"dataloader": _dataloader, "wandb": _wandb, "ray": _ray, "process_group": _process_group,
             "tensorboard": _tensorboard, "mlflow": _mlflow}
