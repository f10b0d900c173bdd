"""On the cluster at RAY_ADDRESS: three actors each start a process (so each says so in GCS,
ray_worker.ARMED); the driver ends one with ray.kill, one with __ray_terminate__, and leaves the
third to its exit (or, with `stopped`, prints READY and waits for the test's SIGTERM). Prints KEYS_MADE: the namespace's key count once the three started, ENDED_LEFT:
how many of the ended actors' keys are left 5 s (at most) later, PIDS: the actors', CHILDREN:
their processes, JOB: the job's id. The workers get NW_RUN (the test's run id) in their environment."""

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
        return os.getpid(), self.child.pid


def keys():
    return ray._private.worker.global_worker.gcs_client.internal_kv_keys(b"", ARMED, timeout=10)


ray.init(runtime_env={"env_vars": {"NW_RUN": os.environ.get("NW_RUN", "")}})
print(f"JOB: {ray.get_runtime_context().get_job_id()}", flush=True)
actors = [Starter.remote() for _ in range(3)]
started = ray.get([actor.start.remote() for actor in actors])
print(f"PIDS: {' '.join(str(pid) for pid, _ in started)}", flush=True)
print(f"CHILDREN: {' '.join(str(child) for _, child in started)}", flush=True)
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
