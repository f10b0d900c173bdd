"""An unmodified training script holding every resource at once, ended one way.

Usage: matrix_job.py ENDING [RESOURCES]

RESOURCES (default all): comma-separated among
  stateful    a StatefulDataLoader with 2 workers, mid-epoch
  persistent  a DataLoader with 2 persistent workers, one epoch done, mid-second
  wandb       a wandb run (offline, named "main") that logs STEPS steps
  ray         a local Ray (started before wandb.init, so the actor has a wandb-core
              of its own) and an actor holding a wandb run ("actor", STEPS steps)
All are held to the end (in a module global), as a trainer object holds them.

ENDING: normal, raise, exit3 (sys.exit(3)), systemexit3 (raise SystemExit(3)),
  interrupt (raise KeyboardInterrupt), sigterm and sigint (print READY, then keep
  iterating until the test sends the signal), thread (a thread using the loaders
  dies of an exception; the main thread then ends normally), fork (a raw
  os.fork() child ends through sys.exit(0); the parent keeps using everything,
  logs one more step and ends normally), spawn (two multiprocessing spawn
  children each make their own resources -- runs named "spawn-normal" and
  "spawn-raise", an actor on the parent's Ray -- one ends normally and one
  raises; the parent then ends normally).

Prints, for the test to check and clean up:
  PIDS: DataLoader worker pids       CORE: wandb-core pids
  ACTOR: actor pids                  ACTOR_CHILDREN: pids of the actor's children
  FORK_CHILD: status of the fork child as os.waitstatus_to_exitcode gives it
  SPAWN_CHILD: NAME exitcode
  AT EXIT: loaders shut down N of M  (from an atexit hook of the script's own,
           registered last so it runs first: what was already shut down then)
"""

import multiprocessing
import os
import sys
import threading
import time

import psutil

STEPS = 10
HELD = None


def report(tag, *values):
    print(f"{tag}:", *values, flush=True)


def make_loaders(kinds):
    import torch  # noqa: F401
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    iterators = []
    if "stateful" in kinds:
        stateful = StatefulDataLoader(list(range(10_000)), batch_size=4, num_workers=2)
        iterators.append(iter(stateful))
        for _ in range(3):
            next(iterators[-1])
    if "persistent" in kinds:
        persistent = DataLoader(list(range(64)), batch_size=4, num_workers=2, persistent_workers=True)
        for _ in persistent:  # one whole epoch: the workers stay for the next
            pass
        iterators.append(iter(persistent))
        next(iterators[-1])
    report("PIDS", *[w.pid for it in iterators for w in it._workers])
    return iterators


def start_run(name):
    import wandb

    run = wandb.init(project="autoteardown-matrix", name=name, reinit="create_new")
    for step in range(STEPS):
        run.log({"x": step})
    return run


def wandb_cores():
    return [p.pid for p in psutil.process_iter(["name", "ppid"]) if p.info["ppid"] == psutil.Process().pid and p.info["name"] == "wandb-core"]


def start_actor():
    import ray

    @ray.remote(num_cpus=0)
    class Holder:
        """As verl's TaskRunner: an actor that owns a wandb run it never finishes.
        (Self-contained: a spawn child's module globals do not reach the actor.)"""

        def start(self, steps):
            import wandb

            self.run = wandb.init(project="autoteardown-matrix", name="actor")
            for step in range(steps):
                self.run.log({"x": step})
            return os.getpid(), [p.pid for p in psutil.Process().children(recursive=True)]

        def ping(self):
            return self.run.id is not None

    if not ray.is_initialized():
        address = os.environ.get("MATRIX_RAY_ADDRESS")  # a spawn child joins its parent's Ray
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=2, include_dashboard=False)
    actor = Holder.remote()
    pid, children = ray.get(actor.start.remote(STEPS))
    report("ACTOR", pid)
    report("ACTOR_CHILDREN", *children)
    return actor


def make_all(kinds, name):
    held = {"iterators": make_loaders(kinds)}
    # Ray first: started after wandb.init, Ray's workers would inherit WANDB_SERVICE
    # and log through this process's wandb-core (see test_faults.py for that case).
    if "ray" in kinds:
        held["actor"] = start_actor()
    if "wandb" in kinds:
        held["run"] = start_run(name)
    report("CORE", *wandb_cores())
    return held


def report_at_exit(held):
    # The shim finalizes before the libraries' exit hooks and before atexit; torch
    # shuts its workers down only later (or not at all): so this sees the shim's work.
    main_pid = os.getpid()

    def at_exit():
        if os.getpid() == main_pid:  # not in a fork child
            iterators = held["iterators"]
            done = sum(getattr(it, "_shutdown", None) is True for it in iterators)
            report("AT EXIT", f"loaders shut down {done} of {len(iterators)}")

    import atexit

    atexit.register(at_exit)


def use(held):
    """Show that every resource still works."""
    for it in held["iterators"]:
        next(it)
    if "actor" in held:
        import ray

        assert ray.get(held["actor"].ping.remote())


def spawn_child(kinds, ending):
    # Runs in a fresh interpreter (spawn): resources of its own, then its ending.
    global HELD
    HELD = make_all(kinds, f"spawn-{ending}")
    if ending == "raise":
        raise ValueError("the spawn child's own error")


def main():
    global HELD
    ending = sys.argv[1]
    kinds = set((sys.argv[2] if len(sys.argv) > 2 else "stateful,persistent,wandb,ray").split(","))
    # Held to the end, as a training script's trainer is. (An actor whose last handle
    # is dropped just before exit is ended by Ray on its own: see test_faults.py.)
    held = HELD = make_all(kinds, "main")
    report_at_exit(held)

    if ending == "raise":
        raise ValueError("the user's own error")
    if ending == "exit3":
        sys.exit(3)
    if ending == "systemexit3":
        raise SystemExit(3)
    if ending == "interrupt":
        raise KeyboardInterrupt
    if ending in ("sigterm", "sigint"):
        report("READY")
        while True:  # mid-epoch (the persistent loader's short epoch stays where it is)
            next(held["iterators"][0])
            time.sleep(0.05)  # a training step
    if ending == "thread":
        def work():
            use(held)
            raise RuntimeError("the thread's own error")

        thread = threading.Thread(target=work, name="worker-thread")
        thread.start()
        thread.join()
    if ending == "fork":
        child = os.fork()
        if child == 0:
            sys.exit(0)  # a raw fork child ending through the normal exit path
        _, status = os.waitpid(child, 0)
        report("FORK_CHILD", os.waitstatus_to_exitcode(status))
        use(held)
        if "run" in held:
            held["run"].log({"x": STEPS})
    if ending == "spawn":
        context = multiprocessing.get_context("spawn")
        if "ray" in kinds:
            import ray

            os.environ["MATRIX_RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        for child_ending in ("normal", "raise"):
            child = context.Process(target=spawn_child, args=(kinds, child_ending), name=child_ending)
            child.start()
            child.join()
            report("SPAWN_CHILD", child_ending, child.exitcode)
        use(held)


if __name__ == "__main__":
    main()
