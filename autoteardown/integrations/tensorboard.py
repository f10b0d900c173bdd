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
from . import Patches, get_version as _version, supported

NAME = KIND = "tensorboard"
ORDER = 25
TARGETS = (("torch.utils.tensorboard.writer", "SummaryWriter"), ("tensorboardX.writer", "SummaryWriter"))
_patches = Patches()


def get_version():
    return _version(NAME)


def patch():
    if not supported(NAME):
        return
    engine.register_kind(KIND, ORDER, close_writer)
    for module_name, class_name in TARGETS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is not None:
            _patches.wrap(cls, "__init__", _record_writer)


def unpatch():
    _patches.restore()


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


def describe(writer):
    return f"SummaryWriter {getattr(writer, 'log_dir', None) or writer.get_logdir()}"
