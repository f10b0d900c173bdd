"""Three live actors, each holding a resource (recorded with the shim) whose
finalizer takes FINALIZE_S seconds and then writes OUT_DIR/<pid>; the driver
simply ends. At its exit the driver asks all of them to finalize in-band: one
parallel wait, not one after another. IDLE=n more actors record nothing (left to
Ray). Prints the actors' pids (IDLE_PIDS: the idle ones) and END (the monotonic
time the driver's own work ended)."""

import os
import time

import ray

SECONDS = float(os.environ.get("FINALIZE_S", "3"))


class Held:
    pass


@ray.remote(num_cpus=0)
class Busy:
    def __init__(self):
        from autoteardown import engine, registry

        def finalize(obj, timeout):
            time.sleep(SECONDS)
            with open(os.path.join(os.environ["OUT_DIR"], str(os.getpid())), "w") as f:
                f.write("finalized")

        self.held = Held()
        engine.register_kind("slow_finalizer", 5, finalize)
        registry.record("slow_finalizer", self.held)

    def pid(self):
        return os.getpid()


@ray.remote(num_cpus=0)
class Idle:
    def pid(self):
        return os.getpid()


ray.init(num_cpus=2, include_dashboard=False)
actors = [Busy.remote() for _ in range(3)]
idle = [Idle.remote() for _ in range(int(os.environ.get("IDLE", "0")))]
print("PIDS:", *ray.get([a.pid.remote() for a in actors]))
print("IDLE_PIDS:", *ray.get([a.pid.remote() for a in idle]))
print("END:", time.monotonic(), flush=True)
