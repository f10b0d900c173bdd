"""An unmodified training script tail: DataLoader and StatefulDataLoader with live
workers at exit. Usage: dataloader_job.py MODE  (normal, exit3, raise, interrupt,
sigterm, stuck, fork)."""

import atexit
import os
import sys
import time

import psutil
import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader


class Numbers(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return torch.tensor([i])


def kill_children_late():
    # Registered after torch's hook, as Ray does: children die late in the exit.
    # (psutil is imported up front: a first import inside an atexit hook after an
    # uncaught KeyboardInterrupt makes CPython exit 1 instead of dying of SIGINT.)
    for child in psutil.Process().children():
        child.kill()
    time.sleep(0.3)


mode = sys.argv[1]
loader = DataLoader(Numbers(), batch_size=4, num_workers=2)
stateful = StatefulDataLoader(Numbers(), batch_size=4, num_workers=2)
batches = iter(loader)
stateful_batches = iter(stateful)
for _ in range(3):
    next(batches)
    next(stateful_batches)
atexit.register(kill_children_late)
print("PIDS:", *[w.pid for w in batches._workers + stateful_batches._workers], flush=True)

if mode == "exit3":
    sys.exit(3)
if mode == "raise":
    raise ValueError("the user's own error")
if mode == "interrupt":
    raise KeyboardInterrupt
if mode == "sigterm":
    print("READY", flush=True)
    while True:  # mid-epoch
        next(batches)
        next(stateful_batches)
        time.sleep(0.01)
if mode == "stuck":
    # The main thread blocks in C code (a second lock of a plain pthread mutex, as
    # in a collective waiting for a peer): Python signal handlers cannot run.
    import ctypes

    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    print("READY", flush=True)
    libc.pthread_mutex_lock(mutex)
if mode == "fork":
    child = os.fork()
    if child == 0:
        sys.exit(0)  # a raw fork child ending through the normal exit path
    os.waitpid(child, 0)
    time.sleep(0.5)
    for _ in range(20):
        next(batches)
        next(stateful_batches)
    print("PARENT DONE", flush=True)
