"""A controller actor creates N busy actors (each, with CHILD=1, with a process that ignores
SIGTERM, started through a shell that exits: no child of the actor's), waits LEARN_S, then ends them back to back (HOW: kill, terminate,
or both in turn), timing each call; with STOP_GCS=1 the Ray gcs_server this script started is
stopped (SIGSTOP) during the calls and continued (SIGCONT) after them.

Prints PIDS: the actors' pids, CHILDREN: their children, CALL_MS: one figure a call, and
GUARDS: <count> <RSS MB> of the guard processes (ray_guard.py, MARKER=guard) of this run
alive right after the last call. The driver then ends at once."""

import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import ray

N = int(os.environ.get("N", "40"))
HOW = os.environ.get("HOW", "kill")
CHILD = os.environ.get("CHILD") == "1"
LEARN_S = float(os.environ.get("LEARN_S", "3"))
os.environ.setdefault("NW_RUN", uuid.uuid4().hex)  # inherited by Ray's workers, and so by the guards
MARKER = "AUTOTEARDOWN_INTERNAL_RAY_ACTOR"  # ray_guard.MARKER (the script runs without the shim too)


def guards():
    found = []
    for process in psutil.process_iter():
        try:
            env = process.environ()
            if env.get(MARKER) == "guard" and env.get("NW_RUN") == os.environ["NW_RUN"]:
                found.append(process.memory_info().rss)
        except psutil.Error:
            pass
    return len(found), sum(found) / 2**20


@ray.remote(num_cpus=0)
class Busy:
    def start(self):
        child = None
        if CHILD:
            child = int(subprocess.run(["/bin/sh", "-c", '"$@" >/dev/null 2>&1 & echo $!', "sh", sys.executable, "-c",
                                        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                        "time.sleep(600)"], capture_output=True, text=True, timeout=30).stdout)
        return os.getpid(), child

    def spin(self):
        while True:
            time.sleep(0.01)


@ray.remote(num_cpus=0)
class Controller:
    def create(self):
        self.actors = [Busy.remote() for _ in range(N)]
        started = ray.get([actor.start.remote() for actor in self.actors])
        for actor in self.actors:
            actor.spin.remote()
        time.sleep(LEARN_S)  # ALIVE and busy, as an actor usually is when it is ended
        return started

    def end_all(self, gcs_pid):
        took = []
        if gcs_pid:
            os.kill(gcs_pid, signal.SIGSTOP)
        try:
            for i, actor in enumerate(self.actors):
                began = time.perf_counter()
                if HOW == "kill" or HOW == "both" and i % 2:
                    ray.kill(actor)
                else:
                    actor.__ray_terminate__.remote()
                took.append((time.perf_counter() - began) * 1000)
        finally:
            if gcs_pid:
                os.kill(gcs_pid, signal.SIGCONT)
        return took, guards()


def gcs_server():
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() == "gcs_server":
                return child.pid
        except psutil.Error:
            pass
    return None


ray.init(num_cpus=2, include_dashboard=False)
controller = Controller.remote()
started = ray.get(controller.create.remote())
print(f"PIDS: {' '.join(str(pid) for pid, _ in started)}", flush=True)
print(f"CHILDREN: {' '.join(str(child) for _, child in started if child)}", flush=True)
took, (count, rss) = ray.get(controller.end_all.remote(gcs_server() if os.environ.get("STOP_GCS") == "1" else None))
print(f"CALL_MS: {' '.join(f'{ms:.2f}' for ms in took)}", flush=True)
print(f"GUARDS: {count} {rss:.0f}", flush=True)
