"""Unmodified scripts meeting a fault at exit. Usage: faults_job.py FAULT

FAULT:
  finalizers     an extra resource kind (fault injection: cannot be produced for
                 real) whose finalizer raises for one object and hangs for another,
                 ahead of DataLoader workers and a wandb run; ends with sys.exit(3)
  killcore       wandb-core is SIGKILLed mid-run, with DataLoader workers alive; sys.exit(3)
  ray_restart    a local Ray with an actor holding a wandb run; ray.shutdown();
                 Ray started again with a second such actor; the user calls
                 ray.shutdown() again at the end, then the script ends
  user_sigterm   the user's own SIGTERM handler, installed after torch is imported
                 (so after autoteardown's): it sets a flag; the training loop then
                 saves for 1.5 s and calls sys.exit(143)
  sigterm_in_print  SIGTERM arrives while the main thread holds the lock that
                 wandb's console capture takes in every print() (held on purpose)
  imported_twice `import autoteardown` twice and importlib.reload() it, then
                 DataLoader workers and a wandb run; sys.exit(3)
  disabled       says what autoteardown set up (run with AUTOTEARDOWN_DISABLE=1)
  unsupported    says which libraries got patched (the test fakes their versions);
                 DataLoader workers and a wandb run; sys.exit(3)
  actor_dropped  a local Ray and an actor holding a wandb run (its own wandb-core);
                 the driver drops the actor's last handle and calls sys.exit(3)
  shared_core    a local Ray; the driver's own wandb run first, then an actor
                 logging through the same wandb-core (WANDB_SERVICE inherited),
                 held to the end; sys.exit(3)

Prints PIDS: (DataLoader workers), CORE: (wandb-core), ACTOR: and ACTOR_CHILDREN:.
"""

import os
import signal
import sys
import time

import psutil

STEPS = 10
fault = sys.argv[1]


def report(tag, *values):
    print(f"{tag}:", *values, flush=True)


def loaders():
    import torch  # noqa: F401
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    stateful = iter(StatefulDataLoader(list(range(10_000)), batch_size=4, num_workers=2))
    persistent_loader = DataLoader(list(range(64)), batch_size=4, num_workers=2, persistent_workers=True)
    for _ in persistent_loader:
        pass
    persistent = iter(persistent_loader)
    for it in (stateful, persistent):
        next(it)
    report("PIDS", *[w.pid for it in (stateful, persistent) for w in it._workers])
    return [stateful, persistent]


def wandb_run(name="main"):
    import wandb

    run = wandb.init(project="autoteardown-faults", name=name, reinit="create_new")
    for step in range(STEPS):
        run.log({"x": step})
    report("CORE", *[p.pid for p in psutil.process_iter(["name", "ppid"]) if p.info["ppid"] == psutil.Process().pid and p.info["name"] == "wandb-core"])
    return run


def actor(steps=STEPS):
    import ray

    @ray.remote(num_cpus=0)
    class Holder:
        def start(self, steps):
            import wandb

            self.run = wandb.init(project="autoteardown-faults", name="actor", reinit="create_new")
            for step in range(steps):
                self.run.log({"x": step})
            return os.getpid(), [p.pid for p in psutil.Process().children(recursive=True)]

    handle = Holder.remote()
    pid, children = ray.get(handle.start.remote(steps))
    report("ACTOR", pid)
    report("ACTOR_CHILDREN", *children)
    return handle


if fault == "finalizers":
    import threading

    held = loaders(), wandb_run()
    from autoteardown import engine, registry

    class Resource:
        def __init__(self, fault):
            self.fault = fault

    def finalize_one(resource, timeout):
        if resource.fault == "raise":
            raise RuntimeError("injected")
        threading.Event().wait()  # hangs forever

    engine.register_kind("faulty", 1, finalize_one)
    resources = [Resource("raise"), Resource("hang")]
    for resource in resources:
        registry.record("faulty", resource)
    report("EXITING", time.monotonic())
    sys.exit(3)

if fault == "killcore":
    held = loaders(), wandb_run()
    time.sleep(0.5)  # wandb-core reads what is in flight
    core = psutil.Process([p for p in psutil.process_iter(["name", "ppid"]) if p.info["ppid"] == psutil.Process().pid and p.info["name"] == "wandb-core"][0].pid)
    core.kill()
    while core.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)
    time.sleep(0.5)  # so that wandb's reader thread sees the connection drop
    os.write(1, f"EXITING: {time.monotonic()}\n".encode())  # not through sys.stdout: wandb sends it to the dead core
    sys.exit(3)

if fault == "ray_restart":
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    first = actor()
    ray.shutdown()
    report("RESTARTED")
    ray.init(num_cpus=2, include_dashboard=False)
    second = actor()
    ray.shutdown()  # the user's own, at the end

if fault == "user_sigterm":
    held = loaders(), wandb_run()
    calls = []
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    report("READY")
    while not calls:
        for it in held[0]:
            next(it)
        time.sleep(0.01)
    time.sleep(1.5)  # saving a checkpoint
    report("HANDLER_CALLS", len(calls))
    sys.exit(143)

if fault == "sigterm_in_print":
    held = loaders(), wandb_run()
    from wandb.sdk.lib import console_capture

    report("READY")
    # A SIGTERM landing while the main thread is inside print(): wandb's console
    # capture holds this lock while its callbacks run (fault injection: holding it
    # on purpose makes the moment certain). The handler runs here, with it held.
    with console_capture._module_rlock:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)

if fault == "imported_twice":
    import importlib

    import autoteardown
    import autoteardown as again

    importlib.reload(again)
    held = loaders(), wandb_run()
    sys.exit(3)

if fault == "disabled":
    import threading

    import autoteardown  # first, then the libraries

    # isort: split
    import torch.utils.data
    import wandb  # noqa: F401
    import wrapt

    held = loaders()
    report("PATCHED", isinstance(vars(torch.utils.data.DataLoader)["_get_iterator"], wrapt.FunctionWrapper))
    report("LIVE", len(autoteardown.live()))
    report("SIGTERM_DEFAULT", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    report("SYS_EXIT_WRAPPED", hasattr(sys.exit, "__wrapped__"))
    report("EXIT_HOOK", any(f.__module__.startswith("autoteardown") for f in threading._threading_atexits))
    sys.exit(3)

if fault == "unsupported":
    import ray
    import torch.utils.data
    import wandb
    import wrapt

    report("PATCHED_TORCH", isinstance(vars(torch.utils.data.DataLoader)["_get_iterator"], wrapt.FunctionWrapper))
    report("PATCHED_RAY", isinstance(ray.shutdown, wrapt.FunctionWrapper))
    report("PATCHED_WANDB", isinstance(wandb.init, wrapt.FunctionWrapper))
    held = loaders(), wandb_run()
    sys.exit(3)

if fault == "shared_core":
    import ray

    run = wandb_run()
    ray.init(num_cpus=2, include_dashboard=False)
    held = actor()
    sys.exit(3)

if fault == "actor_dropped":
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    dropped = actor()
    del dropped  # its last handle: Ray ends the actor on its own
    sys.exit(3)
