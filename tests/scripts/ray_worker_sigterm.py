"""An actor with one recorded resource whose teardown step writes down where it ran:
its thread and the main thread's stack at that moment. The driver SIGTERMs the
actor's process (as a stopped job or Ray's raylet does) while a method runs
(busy) or between methods (idle), waits for the process to end and prints the
record. Usage: ray_worker_sigterm.py busy|idle OUT_FILE"""

import json
import os
import sys
import time

import ray

from procs import running

MODE, OUT = sys.argv[1], sys.argv[2]


class Probe:
    """A resource of a kind of its own: its teardown step records where it runs."""


def where_the_step_ran(probe, timeout):
    import threading
    import traceback

    main = sys._current_frames()[threading.main_thread().ident]
    stack = [f"{f.name} ({os.path.basename(f.filename)})" for f in traceback.extract_stack(main)]
    with open(OUT, "w") as f:
        json.dump({"thread": threading.current_thread().name, "main_stack": stack}, f)


@ray.remote(num_cpus=1)
class Actor:
    def setup(self):
        from autoteardown import engine, registry

        engine.register_kind("probe", 5, where_the_step_ran)
        self.probe = Probe()
        registry.record("probe", self.probe)
        return os.getpid()

    def work(self):
        open(OUT + ".working", "w").close()
        while True:
            time.sleep(0.05)


ray.init(num_cpus=2, include_dashboard=False)
actor = Actor.remote()
pid = ray.get(actor.setup.remote())
print("ACTOR:", pid, flush=True)
if MODE == "busy":
    actor.work.remote()
    deadline = time.monotonic() + 60
    while not os.path.exists(OUT + ".working") and time.monotonic() < deadline:
        time.sleep(0.05)  # the method is under way
    print("WORKING:", os.path.exists(OUT + ".working"), flush=True)
os.kill(pid, 15)
deadline = time.monotonic() + 20
while running(pid) and time.monotonic() < deadline:
    time.sleep(0.1)
print("GONE:", not running(pid), flush=True)
print("PROBE:", open(OUT).read() if os.path.exists(OUT) else "none", flush=True)
