"""TensorBoard SummaryWriters: close them at exit, or a daemon thread's queue of events
is lost. Before wandb, which can sync TensorBoard files.
"""

import sys

from .. import registry
from ..patches import Patches
from . import kind_of, recording

KIND = kind_of(__name__)
TARGETS = (("torch.utils.tensorboard.writer", "SummaryWriter"), ("tensorboardX.writer", "SummaryWriter"))


def patch(patches: Patches) -> None:
    for module_name, class_name in TARGETS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is not None:
            patches.wrap(cls, "__init__", recording(lambda writer: registry.record(KIND, writer)))


def finalize_one(writer, timeout: float) -> None:
    writer.close()  # flushes and closes every event file; does nothing on a writer already closed


def describe(writer) -> str:
    return f"SummaryWriter {getattr(writer, 'log_dir', None) or writer.get_logdir()}"
