"""For tests/benchmark.py: a script with 8 live DataLoader workers, 2 wandb runs
(offline, 100 steps each) and 2 Ray actors (local Ray) at its end.
Usage: bench_exit.py shim|none|hand|hand-flush

shim, none: the script just ends (run with the shim, autoteardown tears down; without
  it, the libraries' own exit hooks do what they do). Either way Ray's exit hook sleeps
  0.5 s first "to make sure that log messages finish printing" (ray.shutdown's
  _exiting_interpreter), which an explicit ray.shutdown() skips.
hand: the script tears the same resources down itself first, as a careful user
  would: _shutdown_workers(), finish() each run, ray.shutdown(); it prints how
  long that took ("TEARDOWN: s").
hand-flush: the same, but ray.shutdown() left to Ray's exit hook and its 0.5 s log
  flush, as the shim leaves it: the shim's own cost against the same work by hand.
Prints "END: time.monotonic()" when its own code is done (before exit).
"""

import sys
import time

import ray
import torch  # noqa: F401
import wandb
from torch.utils.data import DataLoader


@ray.remote(num_cpus=0)
class Idle:
    def ready(self):
        return True


ray.init(num_cpus=2, include_dashboard=False)
actors = [Idle.remote() for _ in range(2)]
ray.get([actor.ready.remote() for actor in actors])
batches = iter(DataLoader(list(range(10_000)), batch_size=4, num_workers=8))
for _ in range(20):
    next(batches)
runs = [wandb.init(project="benchmark", reinit="create_new") for _ in range(2)]
for run in runs:
    for step in range(100):
        run.log({"loss": 1 / (step + 1)})

if sys.argv[1].startswith("hand"):
    started = time.monotonic()
    batches._shutdown_workers()
    for run in runs:
        run.finish()
    if sys.argv[1] == "hand":
        ray.shutdown()
    print("TEARDOWN:", time.monotonic() - started, flush=True)
print("END:", time.monotonic(), flush=True)
