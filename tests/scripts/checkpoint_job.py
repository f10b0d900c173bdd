"""A training loop's async checkpoint, as torchtitan and verl save: torch.distributed.checkpoint
.async_save on gloo, world size 1, the thread checkpointer. Usage:
checkpoint_job.py DIR MODE [MEGABYTES]
  sigterm   save, print READY, then go on training (the test sends SIGTERM)
  raise     save, then an uncaught exception
  exit3     save, then sys.exit(3)
  slow      save through a writer slowed down on purpose (30 s), READY, go on
  hand      as sigterm, with the script's own SIGTERM handler waiting for the save (the
            benchmark's reference: what a user would write by hand)
  load      load DIR/ckpt into fresh tensors; print LOADED: equal|different
Prints SAVING: <monotonic time> when async_save returns."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

folder, mode = sys.argv[1], sys.argv[2]
megabytes = int(sys.argv[3]) if len(sys.argv) > 3 else 100
checkpoint = os.path.join(folder, "ckpt")


def state(seed):
    generator = torch.Generator().manual_seed(seed)
    count = megabytes * 2**20 // 4 // 8  # 8 float32 tensors
    return {f"layer{i}": torch.randn(count, generator=generator) for i in range(8)}


class SlowWriter(FileSystemWriter):
    """A storage slowed down on purpose (a remote file system under load)."""

    def write_data(self, plan, planner):
        time.sleep(30)
        return super().write_data(plan, planner)


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
if mode == "load":
    loaded = {k: torch.zeros_like(v) for k, v in state(0).items()}
    dcp.load(loaded, checkpoint_id=checkpoint)
    expected = state(0)
    print("LOADED:", "equal" if all(torch.equal(loaded[k], expected[k]) for k in expected) else "different",
          flush=True)
    sys.exit(0)

writer = SlowWriter(checkpoint) if mode == "slow" else None
future = dcp.async_save(state(0), checkpoint_id=checkpoint, storage_writer=writer)
print("SAVING:", time.monotonic(), flush=True)
if mode == "hand":
    def wait_then_die(signum, frame):
        future.result()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, wait_then_die)
if mode == "raise":
    raise ValueError("the user's own error")
if mode == "exit3":
    sys.exit(3)
print("READY", flush=True)
weights = torch.randn(256, 256)
while True:  # training goes on while the checkpoint is written
    weights = torch.tanh(weights @ weights.T / 256)
