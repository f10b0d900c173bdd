"""TensorBoard SummaryWriters: close them at exit, or a daemon thread's queue of events
is lost. Order 25: before wandb (30), which can sync TensorBoard files.
"""

import sys

from .. import engine, registry
from . import Patches, contract, recording, supported

NAME, KIND, ORDER = "tensorboard", "tensorboard", 25
TARGETS = (("torch.utils.tensorboard.writer", "SummaryWriter"), ("tensorboardX.writer", "SummaryWriter"))
_patches = Patches()
get_version, unpatch = contract(NAME, _patches)


def patch():
    if not supported(NAME):
        return
    engine.register_kind(KIND, ORDER, close_writer)
    for module_name, class_name in TARGETS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is not None:
            _patches.wrap(cls, "__init__", recording(lambda writer: registry.record(KIND, writer)))


def close_writer(writer, timeout):
    writer.close()  # flushes and closes every event file; does nothing on a writer already closed


def describe(writer):
    return f"SummaryWriter {getattr(writer, 'log_dir', None) or writer.get_logdir()}"
