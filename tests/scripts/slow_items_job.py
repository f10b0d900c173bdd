"""A DataLoader whose items take long to load (decoding video, a remote read), 2 workers;
the script ends after its first batch (item 0, which is quick), with workers busy loading items nobody will read.
Usage: slow_items_job.py SECONDS_PER_ITEM ENDING  (normal, raise)."""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

SECONDS, ENDING = float(sys.argv[1]), sys.argv[2]


class Slow(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        time.sleep(SECONDS if i else 0.0)  # the first batch at once, the next ones slow
        return torch.tensor([i])


batches = iter(DataLoader(Slow(), batch_size=1, num_workers=2))
next(batches)
print("PIDS:", *[w.pid for w in batches._workers], flush=True)
print("END:", time.monotonic(), flush=True)
if ENDING == "raise":
    raise ValueError("the user's own error")
