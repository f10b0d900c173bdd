"""An actor (Holder) creates RUNS Engines, each with a child process, and ends each one after a
second, by __ray_terminate__ or ray.kill in turn; it times each call (what the shim's hand-off adds
to it). Prints TERMINATE_MS: and KILL_MS: (one figure a call), CHILDREN: the engines' children."""

import os
import subprocess
import sys
import time

import ray

RUNS = int(os.environ.get("RUNS", "5"))


@ray.remote(num_cpus=0)
class Engine:
    def start(self):
        self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        return self.child.pid


@ray.remote(num_cpus=0)
class Holder:
    def end_each(self, how):
        took, children = [], []
        for _ in range(RUNS):
            engine = Engine.remote()
            children.append(ray.get(engine.start.remote()))
            time.sleep(1.0)  # ALIVE, as an actor usually is when it is ended
            began = time.perf_counter()
            if how == "terminate":
                engine.__ray_terminate__.remote()
            else:
                ray.kill(engine)
            took.append((time.perf_counter() - began) * 1000)
        return took, children


ray.init(num_cpus=2, include_dashboard=False)
holder = Holder.remote()
children = []
for how in ("terminate", "kill"):
    took, started = ray.get(holder.end_each.remote(how))
    children += started
    print(f"{how.upper()}_MS: {' '.join(f'{ms:.1f}' for ms in took)}", flush=True)
print(f"CHILDREN: {' '.join(map(str, children))}", flush=True)
time.sleep(3)  # the endings run their course before the driver ends
