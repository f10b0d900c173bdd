"""An actor that starts a process tree, the shape of an inference engine (vLLM's EngineCore
and its workers), then is busy in a method; the job ends one way. Usage:
ray_tree_job.py ENDING [RECORD] (RECORD=record: the actor also records a resource, so it
has something of its own to tear down).

The tree: a `multiprocessing` spawn child (the engine core) that starts a grandchild in a
new session (a worker; on SIGTERM it writes a line "released" to TREE_DIR/<pid>, one for each
SIGTERM, and ends 0.5 s after the first, as an engine releasing its devices), and a
`subprocess` child that starts a grandchild (same session). The driver also starts a
process of its own (BYSTANDER), which no ending may touch.

ENDING: end (the driver's script just ends), sigterm (waits for the test's SIGTERM), group
(the same, the SIGTERM sent to the driver's process group),
shutdown (ray.shutdown(), then the driver waits 2 x grace before it ends), terminate
(`__ray_terminate__`, then the same wait), hang (the same, the actor's exit hangs), kill
(`ray.kill`, the same wait), crash (the actor os._exit()s; the driver, still running, prints
TREE_GONE: the ms from the crash until the tree is gone, then the same wait), segfault
(the actor reads address 0, the same), nested (an actor,
Holder, created the Engine and keeps it busy: it sends the Engine `__ray_terminate__`, and the
driver at once sends Holder one, then the same wait), dropped (the same, but the driver then
drops its handle to Holder, which Ray kills with no Python hook: Ray Train v1's trial actor's end
on Ray 2.40).

TREE_ON_NODE: the actor goes to the node with that custom resource (RAY_ADDRESS: a cluster).
Prints ACTOR: pid, TREE: the tree's pids, BYSTANDER: pid, READY once busy."""

import multiprocessing
import os
import subprocess
import sys
import time

import ray

ENDING = sys.argv[1]
RECORD = len(sys.argv) > 2 and sys.argv[2] == "record"
GRACE = float(os.environ.get("AUTOTEARDOWN_RAY_GRACE_S", "3"))
SLEEPER = "import time\nwhile True: time.sleep(0.1)"
RELEASING = """import os, signal, sys, time
open(os.path.join(os.environ["TREE_DIR"], "started"), "w").close()
ending = []
def released(*_):
    with open(os.path.join(os.environ["TREE_DIR"], str(os.getpid())), "a") as record:
        record.write("released\\n")
    ending.append(time.monotonic() + 0.5)
signal.signal(signal.SIGTERM, released)
while not ending or time.monotonic() < ending[0]:
    time.sleep(0.05)
sys.exit(0)"""


def say(text):
    sys.stdout.write(text + "\n")  # one write: Ray forwards each write as lines of its own
    sys.stdout.flush()


class Kept:
    pass


@ray.remote(num_cpus=0)
class Engine:
    def start(self):
        import atexit

        if ENDING == "hang":
            atexit.register(time.sleep, 1000)
        if RECORD:
            from autoteardown import engine, registry

            engine.register_kind("kept", 5, lambda obj, timeout: None)
            self.kept = Kept()
            registry.record("kept", self.kept)
        import psutil

        # The engine core: a spawn child (it runs Python that starts the worker in a new session).
        core = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {RELEASING!r}], start_new_session=True)\n"
        self.core = multiprocessing.get_context("spawn").Process(
            target=subprocess.call, args=([sys.executable, "-c", core + SLEEPER],), daemon=True)
        self.core.start()
        # A helper and its own child, in this session.
        helper = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {SLEEPER!r}])\n"
        self.helper = subprocess.Popen([sys.executable, "-c", helper + SLEEPER])
        while not (os.path.exists(os.path.join(os.environ["TREE_DIR"], "started"))
                   and psutil.Process(self.helper.pid).children()):
            time.sleep(0.05)
        return os.getpid(), [p.pid for p in psutil.Process().children(recursive=True)]

    def busy(self):
        if ENDING in ("crash", "segfault"):
            time.sleep(2)  # after READY: the driver sees the crash while it runs
            with open(os.path.join(os.environ["TREE_DIR"], "crashed"), "w") as file:
                file.write(str(time.time()))
        if ENDING == "crash":
            os._exit(1)
        if ENDING == "segfault":
            import ctypes

            ctypes.string_at(0)
        while True:
            time.sleep(0.1)


@ray.remote(num_cpus=0)
class Holder:
    def start(self, **placement):
        self.engine = Engine.options(**placement).remote()
        started = ray.get(self.engine.start.remote())
        self.busy = self.engine.busy.remote()
        return started

    def end_engine(self):
        self.engine.__ray_terminate__.remote()


local = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": 2, "include_dashboard": False}
ray.init(**local)
# In a session of its own: only a signal meant for it reaches it (a group's SIGTERM does not).
bystander = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
# TREE_ON_NODE: a custom resource only another node of the cluster has.
placement = {"resources": {os.environ["TREE_ON_NODE"]: 0.01}} if os.environ.get("TREE_ON_NODE") else {}
runtime_env = {"env_vars": {"TREE_DIR": os.environ["TREE_DIR"]}}
if ENDING in ("nested", "dropped"):
    holder = Holder.options(runtime_env=runtime_env).remote()
    pid, tree = ray.get(holder.start.remote(runtime_env=runtime_env, **placement))
else:
    engine = Engine.options(runtime_env=runtime_env, **placement).remote()
    pid, tree = ray.get(engine.start.remote())
    busy = engine.busy.remote()
say(f"ACTOR: {pid}\nTREE: {' '.join(map(str, tree))}\nBYSTANDER: {bystander.pid}")
time.sleep(1)  # the method is running
say("READY")
if ENDING in ("sigterm", "group"):
    time.sleep(600)
elif ENDING == "shutdown":
    ray.shutdown()
elif ENDING in ("terminate", "hang"):
    engine.__ray_terminate__.remote()
elif ENDING in ("nested", "dropped"):
    ray.get(holder.end_engine.remote())
    if ENDING == "nested":
        holder.__ray_terminate__.remote()
    else:
        del holder  # its last handle: Ray kills it at once, no Python runs in it
elif ENDING == "kill":
    ray.kill(engine)
elif ENDING in ("crash", "segfault"):
    import psutil

    try:
        ray.get(busy)
    except Exception:  # the actor died
        pass
    with open(os.path.join(os.environ["TREE_DIR"], "crashed")) as file:
        crashed = float(file.read())

    def running(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    while any(running(pid) for pid in tree) and time.time() < crashed + 4 * GRACE + 30:
        time.sleep(0.02)
    say(f"TREE_GONE: {(time.time() - crashed) * 1000:.0f}")
if ENDING != "end":
    time.sleep(2 * GRACE)
say("DONE")
