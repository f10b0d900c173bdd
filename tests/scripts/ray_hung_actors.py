"""Actors whose teardown hangs, ended with __ray_terminate__ (plain and through
.options()), next to one that is left running. Usage: ray_hung_actors.py WORKERS
(inherit: workers get whatever the driver's environment gives them; off: the shim
is disabled in the actors; runtime_env: the actors get autoteardown and wrapt
through py_modules + worker_process_setup_hook, as documented).

HANG=atexit (default): an atexit callback sleeps forever; HANG=gc: gc is
disabled and a reference cycle's __del__ sleeps forever; HANG=slow: a resource
recorded with the shim takes 7 s to finalize, then teardown ends normally."""

import importlib.util
import os
import sys
import time

import psutil
import ray

from procs import running

workers = sys.argv[1]
package = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "autoteardown"))
wrapt_dir = os.path.dirname(importlib.util.find_spec("wrapt").origin)
job_env = {"py_modules": [package, wrapt_dir], "worker_process_setup_hook": "autoteardown.install"}
local = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": 2, "include_dashboard": False}
ray.init(runtime_env=job_env if workers == "runtime_env" else None, **local)
env = {"env_vars": {"AUTOTEARDOWN_DISABLE": "1"}} if workers == "off" else {}
# HUNG_ON_NODE: a custom resource only another node of the cluster has.
placement = {"resources": {os.environ["HUNG_ON_NODE"]: 0.01}} if os.environ.get("HUNG_ON_NODE") else {}


HANG = os.environ.get("HANG", "atexit")


class Cycle:
    def __init__(self):
        self.me = self

    def __del__(self):
        time.sleep(1000)


class Slow:
    pass


@ray.remote(num_cpus=0)
class Hangs:
    def __init__(self):
        import atexit
        import gc

        if HANG == "atexit":
            atexit.register(time.sleep, 1000)  # interpreter teardown never ends
        elif HANG == "gc":  # as trainers that disable gc do; only gc.collect() reaches the cycle
            gc.disable()
            Cycle()
        elif HANG == "slow":
            from autoteardown import engine, registry

            self.slow = Slow()
            engine.register_kind("slow_finalizer", 5, lambda obj, timeout: time.sleep(7))
            registry.record("slow_finalizer", self.slow)

    def pid(self):
        return os.getpid()


Hangs = Hangs.options(runtime_env=env, **placement)
first, second, bystander = Hangs.remote(), Hangs.remote(), Hangs.remote()
pids = ray.get([first.pid.remote(), second.pid.remote()])
bystander_pid = ray.get(bystander.pid.remote())
print("PIDS:", *pids)
print("BYSTANDER:", bystander_pid, flush=True)
first.__ray_terminate__.remote()
second.__ray_terminate__.options(name="stop").remote()
sent = time.monotonic()
while time.monotonic() - sent < float(os.environ.get("WATCH_S", "8")):
    time.sleep(0.1)
    gone = [pid for pid in pids if not running(pid)]
    if len(gone) == len(pids):
        break
print("GONE_AFTER:", round(time.monotonic() - sent, 2))
print("ALIVE:", *[pid for pid in pids if running(pid)])
print("BYSTANDER_ALIVE:", psutil.pid_exists(bystander_pid), flush=True)
