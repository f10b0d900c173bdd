"""A Ray driver with a wandb run (offline) whose main thread waits inside a finalizer (a
`__del__`): the unwind Ray's SIGTERM handler raises (sys.exit) lands there, and Python drops it
("Exception ignored in"). Usage: ray_driver_lost_unwind.py [each|once]
each: 60 s of objects whose `__del__` waits 0.5 s (in short sleeps: a signal delivered to
      another thread is run there too); once: one object whose `__del__` waits 60 s, then 3 s
      more of the script's own work.
Prints READY once the main thread is waiting in a `__del__`, LOOP_ENDED if the script gets to
its end: a SIGTERM'd driver must not."""

import sys
import time

import ray
import wandb

ray.init(num_cpus=1, include_dashboard=False)
run = wandb.init(project="autoteardown-tests", mode="offline")


def wait(seconds, then=None):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.01)
        if then is not None:
            print(then, flush=True)
            then = None


class Slow:
    def __init__(self, seconds, then=None):
        self.seconds, self.then = seconds, then

    def __del__(self):
        wait(self.seconds, self.then)


if sys.argv[1:] == ["once"]:
    Slow(60, "READY")  # collected at once: its __del__ runs in the main thread
    wait(3)
else:
    Slow(0.5, "READY")
    until = time.monotonic() + 60
    while time.monotonic() < until:
        Slow(0.5)
print("LOOP_ENDED", flush=True)
