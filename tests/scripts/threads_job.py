"""Resources created and dropped from several threads while the exit begins.

Usage: threads_job.py churn | forklock

churn: 4 threads each make DataLoader and StatefulDataLoader iterators with one
  worker and drop them, again and again, for CHURN_S seconds; the main thread
  holds a wandb run and a StatefulDataLoader with 2 workers, and calls
  sys.exit(3) after EXIT_AFTER_S seconds, while the threads are still at it (the
  exit then runs alongside them, and Python joins them afterwards).
forklock: a DataLoader worker is forked while another thread is inside the
  shim's registry (fault injection: holding its lock on purpose stands in for a
  thread caught in registry.record() at the moment of the fork); sys.exit(3).

Prints "PIDS: ..." for every worker started, "DURING_EXIT: n" (iterators made
after sys.exit was called) and, for forklock, "BATCH: seconds" or "TIMED OUT".
"""

import os
import sys
import threading
import time

import torch  # noqa: F401
import wandb
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

CHURN_S = 3.0
EXIT_AFTER_S = 1.0
exit_called = None  # time.monotonic() of the main thread's sys.exit
during_exit = []


def report(tag, *values):
    # One write per line: print() from several threads can interleave.
    os.write(1, ("%s: %s\n" % (tag, " ".join(map(str, values)))).encode())


def churn(index, until):
    kinds = (DataLoader, StatefulDataLoader)
    count = 0
    while time.monotonic() < until:
        batches = iter(kinds[count % 2](list(range(64)), batch_size=4, num_workers=1))
        report("PIDS", *[w.pid for w in batches._workers])
        if exit_called is not None:
            during_exit.append(index)
        count += 1
        del batches  # dropped: torch's __del__ stops its worker
    if index == 0:
        time.sleep(0.1)
        report("DURING_EXIT", len(during_exit))


mode = sys.argv[1]
run = wandb.init(project="autoteardown-threads", name="main")
for step in range(10):
    run.log({"x": step})
main_batches = iter(StatefulDataLoader(list(range(10_000)), batch_size=4, num_workers=2))
next(main_batches)
report("PIDS", *[w.pid for w in main_batches._workers])

if mode == "churn":
    until = time.monotonic() + CHURN_S
    threads = [threading.Thread(target=churn, args=(i, until)) for i in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(EXIT_AFTER_S)
    exit_called = time.monotonic()
    sys.exit(3)

if mode == "forklock":
    from autoteardown import registry

    inside = threading.Event()

    def inside_the_registry():
        with registry._state.lock:
            inside.set()
            time.sleep(2)

    threading.Thread(target=inside_the_registry, daemon=True).start()
    inside.wait()
    started = time.monotonic()
    batches = iter(DataLoader(list(range(64)), batch_size=4, num_workers=1, timeout=5))
    report("PIDS", *[w.pid for w in batches._workers])
    try:
        next(batches)
        report("BATCH", round(time.monotonic() - started, 2))
    except RuntimeError:  # "DataLoader timed out after 5 seconds": the worker is stuck
        report("TIMED OUT")
    sys.exit(3)
