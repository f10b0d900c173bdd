"""DataLoader workers whose work outlives them: each item is a 10 KB file a worker writes over
about a second (a shard being written, a cache being filled), 2 workers, the main process
reading items until the end comes. Usage: worker_effects_job.py MODE FOLDER

MODE:
  sigterm     READY once some items are read; the main process alone then gets SIGTERM (as
              torchrun and Kubernetes deliver it) and keeps reading until it does
  persistent  persistent_workers=True, with the atexit torch registers for pin_memory on a GPU
              (`_register_persistent_workers_atexit`, called here: no GPU); a normal end while
              the workers write
  handler     a worker_init_fn installs a SIGTERM handler that takes 1.5 s to flush and then
              writes FOLDER/flushed-<pid>; a normal end while the workers write

A complete item file holds SIZE bytes; a truncated one fewer. Prints PIDS: (the workers), READY.
"""

import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

MODE, FOLDER = sys.argv[1], sys.argv[2]
SIZE, CHUNKS = 10_000, 10


class Writes(IterableDataset):
    def __iter__(self):
        worker = get_worker_info().id
        for n in range(1_000):
            path = os.path.join(FOLDER, f"item-{worker}-{n}")
            with open(path, "wb") as out:
                for _ in range(CHUNKS):  # about a second, written as it goes
                    out.write(b"x" * (SIZE // CHUNKS))
                    out.flush()
                    time.sleep(1.0 / CHUNKS)
            yield torch.tensor([n])


def flush_on_sigterm(worker_id):
    def handler(signum, frame):
        time.sleep(1.5)  # a buffer being flushed
        with open(os.path.join(FOLDER, f"flushed-{os.getpid()}"), "w") as out:
            out.write("done")
        os._exit(0)

    signal.signal(signal.SIGTERM, handler)


options = {"persistent": {"persistent_workers": True}, "handler": {"worker_init_fn": flush_on_sigterm}}
loader = DataLoader(Writes(), batch_size=1, num_workers=2, **options.get(MODE, {}))
batches = iter(loader)
if MODE == "persistent":
    batches._register_persistent_workers_atexit()
for _ in range(3):
    next(batches)
print("PIDS:", *[w.pid for w in batches._workers], flush=True)
if MODE == "sigterm":
    print("READY", flush=True)
    for _ in batches:
        pass
time.sleep(0.3)  # the workers are in the middle of an item
print("END:", time.monotonic(), flush=True)
