"""torch.distributed.checkpoint: an async save still in flight completes before the process ends.

`async_save` returns at once and a thread of the process writes the shards, then the
`.metadata` file that makes the checkpoint loadable. A script that ends normally, raises or
calls sys.exit() waits for it without us (concurrent.futures joins its thread at exit); a
SIGTERM (a scheduler's stop) does not: the process dies with the checkpoint half written.
The teardown waits for each save still in flight (its upload future), within the step's
budget of AUTOTEARDOWN_TIMEOUT, after the DataLoader workers (which end at once) and before
the process groups are destroyed (the save's last step gathers over the group). A save that
cannot finish in its budget is left as it is, with one warning: its id, the bytes written,
the time waited. A save stuck on a collective is given up early: a thread of this process
waits in a torch.distributed call (a collective completes only when every rank makes the
matching one: the training loop's own collectives can cross the save's, or a rank is gone),
and for STALL_S nothing progressed: next to no CPU used (BUSY), nothing written to its
checkpoint folder, no child process of its own running (the process checkpointer's writer).
Such a save never completes. A save that is only slow (storage that blocks before it writes)
waits in no collective: its budget alone bounds it. A save the user waited for costs nothing. Both
checkpointers are covered: the thread one (the default) and the process one, whose writer,
a spawn process, outlives its parent without the shim and finishes a save the parent left:
a save left incomplete here is left to that writer (`signals.spare`), which ends itself once
idle.
"""

import os
import sys
import time
import weakref

from .. import cpython, log, registry
from ..patches import Patches
from . import kind_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

KIND = kind_of(__name__)
WARN_S = 0.2
STALL_S = 1.0  # no progress for that long: the save is stuck
POLL_S = 0.1
BUSY = 0.2  # the share of a core that counts as work being done
_saves: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # upload future -> checkpoint id


def patch(patches: Patches) -> None:
    from torch.distributed.checkpoint import state_dict_saver

    if hasattr(state_dict_saver, "async_save"):  # torch.distributed.checkpoint binds it too
        patches.rebind(state_dict_saver.async_save, _on_async_save, "torch.distributed.checkpoint")


def _on_async_save(wrapped, instance, args, kwargs):
    made = wrapped(*args, **kwargs)
    try:  # the upload future of an AsyncSaveResponse, or the Future itself
        future = getattr(made, "upload_completion", made)
        writer = kwargs.get("storage_writer")
        checkpoint = kwargs.get("checkpoint_id") or getattr(writer, "path", None)
        if not future.done():
            _saves[future] = None if checkpoint is None else str(checkpoint)
            registry.record(KIND, future)
    except Exception:
        log.debug_exception("could not record an async checkpoint save")
    return made


def finalize_one(future, timeout: float) -> "str | None":
    """Wait for the save to complete, at most `timeout` seconds."""
    if future.done():
        return None  # waited for by the user, or by concurrent.futures at exit
    import concurrent.futures

    started, checkpoint = time.monotonic(), _saves.get(future)
    until, progress, stalled = started + max(0.0, timeout - WARN_S), _Progress(checkpoint), False
    try:  # a moment of the budget kept to say what is left, within it
        while True:
            try:
                future.result(max(0.0, min(POLL_S, until - time.monotonic())))
                break
            except concurrent.futures.TimeoutError:
                stalled = progress.stalled()
                if stalled or time.monotonic() >= until:
                    raise
    except concurrent.futures.TimeoutError:
        written = _bytes_written(checkpoint)
        log.warning("checkpoint %s not complete after waiting %.1fs (%s written%s): left as it is",
                    checkpoint or "(no id)", time.monotonic() - started,
                    f"{written / 2**20:.0f} MB" if written is not None else "? bytes",
                    f", no progress for {STALL_S:g}s" if stalled else "")
        writer = _writer()
        if writer is not None:
            from .. import signals  # loaded by then: the process is armed

            signals.spare(writer.pid)
        return "left incomplete"
    except Exception as error:  # the storage failed, or the writer process was killed
        log.warning("checkpoint %s not saved: %s", checkpoint or "(no id)", error)
        return "failed"
    return "saved"


class _Progress:
    """Whether a save is still doing something (see the module docstring), looked at each poll."""

    def __init__(self, checkpoint: "str | None") -> None:
        self.checkpoint, self.cpu, self.written = checkpoint, time.process_time(), _bytes_written(checkpoint)
        self.at = self.seen = time.monotonic()

    def stalled(self) -> bool:
        now, cpu, written = time.monotonic(), time.process_time(), _bytes_written(self.checkpoint)
        if cpu - self.cpu > BUSY * (now - self.seen) or written != self.written or _children():
            self.at = now
        self.cpu, self.written, self.seen = cpu, written, now
        return now - self.at >= STALL_S and _in_collective()


def _in_collective() -> bool:
    """Does a thread of this process wait inside a torch.distributed call?"""
    for top in cpython.all_frames():
        frame: "FrameType | None" = top
        while frame is not None:
            if frame.f_globals.get("__name__") == "torch.distributed.distributed_c10d":
                return True
            frame = frame.f_back
    return False


def _children() -> bool:
    """Does a child process of this one run (multiprocessing's: DataLoader workers have ended by now)?"""
    multiprocessing = sys.modules.get("multiprocessing")
    return bool(multiprocessing and multiprocessing.active_children())


def _writer():
    """The process checkpointer's writer while it runs (a save left to it completes there)."""
    executor = sys.modules.get("torch.distributed.checkpoint._async_process_executor")
    writer = getattr(getattr(executor, "_CHECKPOINT_PROCESS", None), "_save_process", None)
    return writer if writer is not None and writer.pid is not None and writer.is_alive() else None


def _bytes_written(checkpoint) -> "int | None":
    try:
        return sum(entry.stat().st_size for entry in os.scandir(checkpoint) if entry.is_file())
    except (OSError, TypeError):
        return None


def describe(future) -> str:
    return f"async save of {_saves.get(future) or 'a checkpoint'}"
