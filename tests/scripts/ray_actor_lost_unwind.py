"""An actor whose main thread is inside a finalizer (a `__del__`) when its process gets SIGTERM:
the unwind Ray's handler raises (SystemExit) lands there and Python drops it ("Exception ignored
in"). The `__del__` waits up to 60 s, then the method goes on with 60 s of its own work.
Usage: ray_actor_lost_unwind.py wandb|nothing OUT_DIR. wandb: the actor holds a wandb run
(offline) with 5 steps; nothing: it holds nothing.
Prints ACTOR: <pid>, then once the actor's process has ended (WATCH_S at most, 60) GONE: <seconds
after the SIGTERM> (or GONE: never) and its stderr between ACTOR_STDERR and END."""

import glob
import os
import sys
import time

import ray

from procs import running

MODE, OUT = sys.argv[1], sys.argv[2]
WATCH_S = float(os.environ.get("WATCH_S", "60"))


def wait(seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.01)


class Slow:
    def __del__(self):
        open(os.path.join(OUT, "in-del"), "w").close()
        wait(60)


@ray.remote(num_cpus=1)
class Actor:
    def setup(self):
        if MODE == "wandb":
            import wandb

            self.run = wandb.init(project="autoteardown-tests", mode="offline", dir=OUT)
            for step in range(5):
                self.run.log({"loss": step})
        return os.getpid()

    def work(self):
        Slow()  # collected at once: its __del__ runs in the main thread, inside this method
        wait(60)


ray.init(num_cpus=2, include_dashboard=False)
actor = Actor.remote()
pid = ray.get(actor.setup.remote())
print("ACTOR:", pid, flush=True)
actor.work.remote()
until = time.monotonic() + 60
while not os.path.exists(os.path.join(OUT, "in-del")) and time.monotonic() < until:
    time.sleep(0.05)
sent = time.monotonic()
os.kill(pid, 15)
while running(pid) and time.monotonic() < sent + WATCH_S:
    time.sleep(0.05)
print("GONE:", "never" if running(pid) else f"{time.monotonic() - sent:.2f}", flush=True)
logs = ray._private.worker.global_worker.node.get_logs_dir_path()
print("ACTOR_STDERR", flush=True)
for path in glob.glob(os.path.join(logs, f"worker-*-{pid}.err")):
    with open(path) as err:
        print(err.read(), flush=True)
print("END", flush=True)
