"""TensorBoard SummaryWriters: flush and close them before wandb finishes.

A SummaryWriter hands each event to a queue that a daemon thread writes out
(tensorboard 2.21's `_AsyncWriter`, 10 events by default; tensorboardX 2.x has
the same design). A script that never calls `close()` loses what is still queued
when the interpreter stops its daemon threads: 0 to 11 of the last events,
measured 89 to 100 of 100 scalars kept here. Neither torch 2.13 nor
tensorboard 2.21 closes writers at exit.

We wrap `SummaryWriter.__init__` (subclasses that call it are recorded too) and
call `close()`, which flushes the queue and closes every event file the writer
opened (`add_scalars` opens one per tag). Order 25: before wandb (30), which can
sync TensorBoard files (`wandb.init(sync_tensorboard=True)`) when it finishes.
"""

import sys

from .. import engine, log, registry
from . import check_version

KIND = "tensorboard"
ORDER = 25
# (module, class, distribution whose version we check, minimum)
TARGETS = (
    ("torch.utils.tensorboard.writer", "SummaryWriter", "tensorboard", "2.0"),
    ("tensorboardX.writer", "SummaryWriter", "tensorboardX", "2.0"),
)
SUPPORTED = "tensorboard >= 2.0 (torch.utils.tensorboard), tensorboardX >= 2.0"
_patched = {}  # (module, class) -> the original __init__


def get_version():
    for name in ("tensorboard", "tensorboardX"):
        version = getattr(sys.modules.get(name), "__version__", None)
        if version:
            return version
    return None


def unsupported_reason():
    reasons = [check_version(dist, minimum) for _, _, dist, minimum in TARGETS]
    return "; ".join(r for r in reasons if r) or None


def patch():
    import wrapt

    for module_name, class_name, distribution, minimum in TARGETS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is None or (module_name, class_name) in _patched:
            continue
        reason = check_version(distribution, minimum)
        if reason:
            log.warning_once("%s; its SummaryWriters are left alone", reason)
            continue
        _patched[(module_name, class_name)] = vars(cls)["__init__"]
        wrapt.wrap_function_wrapper(cls, "__init__", _record_writer)
        log.debug("patched %s.%s.__init__", module_name, class_name)
    if _patched:
        engine.register_kind(KIND, ORDER, close_writer)
        engine.arm()


def unpatch():
    for (module_name, class_name), original in list(_patched.items()):
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is not None:
            cls.__init__ = original
        del _patched[(module_name, class_name)]


def _record_writer(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    try:
        registry.record(KIND, instance)
    except Exception:
        log.debug_exception("could not record %r", instance)


def close_writer(writer, timeout):
    # No fork callback: a fork child's registry starts empty, so it never closes
    # (and writes into) its parent's event files. close() on a writer the script
    # closed does nothing; one it wrote to again after close() is closed again.
    writer.close()
