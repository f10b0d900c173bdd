"""On the cluster at RAY_ADDRESS: three actors each start a process (so each says so in GCS,
ray_worker.ARMED); the driver ends one with ray.kill, one with __ray_terminate__, and leaves the
third to its exit (or, with `stopped`, prints READY and waits for the test's SIGTERM). Prints KEYS_MADE: the namespace's key count once the three started, ENDED_LEFT:
how many of the ended actors' keys are left 5 s (at most) later, PIDS: the actors'."""

import os
import subprocess
import sys
import time

import ray

ARMED = b"autoteardown-armed"


@ray.remote(num_cpus=0)
class Starter:
    def start(self):
        self.child = subprocess.Popen(["sleep", "60"])
        return os.getpid()


def keys():
    return ray._private.worker.global_worker.gcs_client.internal_kv_keys(b"", ARMED, timeout=10)


ray.init()
actors = [Starter.remote() for _ in range(3)]
print(f"PIDS: {' '.join(str(pid) for pid in ray.get([actor.start.remote() for actor in actors]))}", flush=True)
print(f"KEYS_MADE: {len(keys())}", flush=True)
ended = [actor._ray_actor_id.hex() for actor in actors[:2]]
ray.kill(actors[0])
actors[1].__ray_terminate__.remote()
until = time.monotonic() + 5
while any(actor_id.encode() in key for key in keys() for actor_id in ended) and time.monotonic() < until:
    time.sleep(0.1)
print(f"ENDED_LEFT: {sum(actor_id.encode() in key for key in keys() for actor_id in ended)}", flush=True)
if sys.argv[1:] == ["stopped"]:
    print("READY", flush=True)
    time.sleep(600)
