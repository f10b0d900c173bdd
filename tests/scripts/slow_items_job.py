"""A DataLoader whose items take long to load (decoding video, a remote read), 2 workers;
the script ends after its first batch (item 0, which is quick), with workers busy loading items nobody will read.
Usage: slow_items_job.py SECONDS_PER_ITEM ENDING [held]  (normal, raise).

held: a worker ended while loading dies holding the lock of the done event it shares with its
parent (a SIGTERM that lands inside torch's `done_event.is_set()`, which happens now and then under
load, made certain here: its handler takes the lock and exits as torch's own handler does)."""

import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

SECONDS, ENDING, HELD = float(sys.argv[1]), sys.argv[2], sys.argv[3:] == ["held"]


def die_holding_the_done_event():
    frame = sys._getframe()
    while frame.f_code.co_name != "_worker_loop":
        frame = frame.f_back
    done_event = frame.f_locals["done_event"]

    def on_sigterm(signum, _):
        done_event._cond.acquire()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)


class Slow(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if HELD and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            die_holding_the_done_event()
        time.sleep(SECONDS if i else 0.0)  # the first batch at once, the next ones slow
        return torch.tensor([i])


batches = iter(DataLoader(Slow(), batch_size=1, num_workers=2))
next(batches)
print("PIDS:", *[w.pid for w in batches._workers], flush=True)
print("END:", time.monotonic(), flush=True)
if ENDING == "raise":
    raise ValueError("the user's own error")
