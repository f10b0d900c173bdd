"""The zero-CPU task a driver pins to another node, run against this node: its
guard kills an actor that hangs after __ray_terminate__ (autoteardown itself disabled)."""

import os
import time

import ray

from procs import running

from autoteardown.integrations.ray_guard import remote_end_on, source

ray.init()


@ray.remote(num_cpus=0)
class Hangs:
    def __init__(self):
        import atexit

        atexit.register(time.sleep, 1000)

    def where(self):
        return os.getpid(), ray.get_runtime_context().get_node_id()


actor = Hangs.remote()
pid, node_id = ray.get(actor.where.remote())
print("PIDS:", pid, flush=True)
requested_at = time.time()
actor.__ray_terminate__.remote()
time.sleep(1)
killed, _ = ray.get(remote_end_on(node_id).remote(node_id, pid, requested_at, actor._ray_actor_id.hex(), time.time(), 1.0, 0,
                                                  source()), timeout=60)
print("KILLED:", killed)
# A SIGKILLed worker takes a moment to end (its threads, its mappings): poll, within a bound.
gone_by = time.monotonic() + 10
while running(pid) and time.monotonic() < gone_by:
    time.sleep(0.05)
print("ALIVE:", *[pid] if running(pid) else [], flush=True)
