"""A training loop's async checkpoint, as torchtitan and verl save: torch.distributed.checkpoint
.async_save on gloo. World size 1, or each rank of a torchrun job (RANK set). Usage:
checkpoint_job.py DIR MODE [MEGABYTES]
  sigterm   save, print READY, then go on training (the test sends SIGTERM)
  raise     save, then an uncaught exception
  exit3     save, then sys.exit(3)
  slow      save through a writer slowed down on purpose (SLOW_WRITE_S, 30 s), READY, go on
  hand      as sigterm, with the script's own SIGTERM handler waiting for the save (the
            benchmark's reference: what a user would write by hand)
  waited    save, wait for it, print PIDS: <writer pid> (the process checkpointer's) and
            READY, go on
  crossed   as sigterm, training in an all_reduce loop on the same group as the save's own
            collectives, which cross them: the save never completes (the test signals every process)
  load      load DIR/ckpt into fresh tensors (every rank's); print LOADED: equal|different
CHECKPOINTER=process selects AsyncCheckpointerType.PROCESS (its writer is a spawn process);
the default is the thread checkpointer. Prints SAVING: <monotonic time> when async_save
returns."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType


class SlowWriter(FileSystemWriter):
    """A storage slowed down on purpose (a remote file system under load)."""

    def write_data(self, plan, planner):
        time.sleep(float(os.environ.get("SLOW_WRITE_S", "30")))
        return super().write_data(plan, planner)


def state(rank, megabytes, seed=0):
    """Rank `rank`'s shard: its own keys, so the checkpoint holds every rank's."""
    generator = torch.Generator().manual_seed(seed + rank)
    count = megabytes * 2**20 // 4 // 8  # 8 float32 tensors
    return {f"rank{rank}.layer{i}": torch.randn(count, generator=generator) for i in range(8)}


def main():
    folder, mode = sys.argv[1], sys.argv[2]
    megabytes = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    checkpoint = os.path.join(folder, "ckpt")
    ranks = int(os.environ.get("CHECKPOINT_RANKS", "1"))
    if mode == "load" or "RANK" not in os.environ:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "load":
        expected = {k: v for r in range(ranks) for k, v in state(r, megabytes).items()}
        loaded = {k: torch.zeros_like(v) for k, v in expected.items()}
        dcp.load(loaded, checkpoint_id=checkpoint)
        equal = all(torch.equal(loaded[k], expected[k]) for k in expected)
        print("LOADED:", "equal" if equal else "different", flush=True)
        sys.exit(0)

    kind = AsyncCheckpointerType.PROCESS if os.environ.get("CHECKPOINTER") == "process" else AsyncCheckpointerType.THREAD
    writer = SlowWriter(checkpoint) if mode == "slow" else None
    future = dcp.async_save(state(rank, megabytes), checkpoint_id=checkpoint, storage_writer=writer,
                            async_checkpointer_type=kind)
    print("SAVING:", time.monotonic(), flush=True)
    if mode == "waited":
        future.result()
        from torch.distributed.checkpoint import _async_process_executor as executor

        writer_process = getattr(executor._CHECKPOINT_PROCESS, "_save_process", None)
        print("PIDS:", writer_process.pid if writer_process else "", flush=True)
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
    os.write(1, f"READY {rank}\n".encode())  # one write: torchrun's ranks share one stdout
    weights = torch.randn(256, 256)
    while mode == "crossed":
        dist.all_reduce(weights)
    while True:  # training goes on while the checkpoint is written
        weights = torch.tanh(weights @ weights.T / 256)


if __name__ == "__main__":  # the process checkpointer's writer is a spawn process: it imports this file
    main()
