"""Unmodified scripts for the core's rules (issue: a small, principled core). Usage: rules_job.py MODE

MODE:
  thread      the main thread returns while a non-daemon thread still iterates its own
              DataLoader (150 steps); prints THREAD: steps done
  stuck       DataLoader workers + a wandb run + a slow last step (fault injection: 3 s);
              the main thread is in C code (hashlib.pbkdf2_hmac, about 2 s) when SIGTERM
              comes; prints RAN ON if its loop runs another step afterwards
  weakref     DataLoader workers; SIGTERM arrives inside a weakref.finalize callback
  gc          DataLoader workers; SIGTERM arrives inside a gc callback
  with        `with wandb.init() as run:` + SIGTERM while logging
  lock        DataLoader workers; SIGTERM while the main thread holds the lock that the
              signal path's timers use
  uninstall   DataLoader workers, autoteardown.uninstall(), then a pipe of the user's:
              prints PIPE: the bytes it read back
  spawnchild  a spawn multiprocessing child that iterates a DataLoader with 2 workers and returns;
              prints MPEXIT: how many workers are alive when multiprocessing's exit begins
  dropped     a DataLoader iterator recorded and dropped before the end (nothing left at exit)
  exitcodes   a caught sys.exit(2), then a bare `raise SystemExit(5)`, with DataLoader workers
  spawnworker a spawn DataLoader worker prints ARMED: whether its SIGTERM handler is ours and
              its thread count
  pool        a ProcessPoolExecutor(2) running 60 s tasks, a DataLoader; SIGTERM to the parent
  waitmain W  a non-daemon thread waits for the main thread to end (W: join, alive: an is_alive()
              loop), then prints WAITED:; a DataLoader with workers and a live iterator at the end
  spawnwait W the same in a spawn multiprocessing child (its loader, its waiting thread)

Prints PIDS: (DataLoader workers, pool workers), READY when waiting for a signal.
"""

import os
import signal
import sys
import threading
import time


def report(tag, *values):
    print(f"{tag}:", *values, flush=True)


def loader(workers=2, **kwargs):
    from torch.utils.data import DataLoader

    it = iter(DataLoader(list(range(100_000)), batch_size=4, num_workers=workers, **kwargs))
    next(it)
    report("PIDS", *[w.pid for w in it._workers])
    return it


def spawn_worker_init(worker_id):
    import autoteardown.signals as signals  # present only if something imported it

    ours = signal.getsignal(signal.SIGTERM) is getattr(signals, "_handler", None)
    names = sorted(t.name for t in threading.enumerate() if t.name.startswith("autoteardown"))
    report("ARMED", ours, ",".join(names) or "-")


def spawn_child():
    import multiprocessing.util

    global kept
    kept = loader()  # alive at the child's exit, as a trainer's loader is
    for _ in range(20):
        next(kept)
    # Runs first in multiprocessing's exit function, which then SIGTERMs daemonic children.
    multiprocessing.util.Finalize(None, lambda: report("MPEXIT", sum(w.is_alive() for w in kept._workers)),
                                  exitpriority=100)


def wait_for_main(how):
    def waiter():
        if how == "join":
            threading.main_thread().join()
        else:
            while threading.main_thread().is_alive():
                time.sleep(0.01)
        report("WAITED", how)

    threading.Thread(target=waiter, name="waits-for-main").start()


def spawn_wait(how):
    global kept
    kept = loader()
    wait_for_main(how)


def square(x):
    time.sleep(60)
    return x * x


def main(mode):
    if mode == "thread":
        started = threading.Event()

        def train():
            it = loader()
            started.set()
            steps = 0
            for _ in range(150):
                next(it)
                steps += 1
                time.sleep(0.01)
            report("THREAD", steps)

        threading.Thread(target=train).start()
        started.wait(60)
        return
    if mode == "stuck":
        import hashlib

        import wandb

        from autoteardown import engine, registry

        it = loader()
        run = wandb.init(project="autoteardown-tests", name="main")
        for step in range(10):
            run.log({"x": step})

        class Upload:  # fault injection: a slow last step (an upload), so the teardown lasts
            pass

        upload = Upload()
        engine.register_kind("upload", 50, lambda obj, timeout: time.sleep(min(3.0, timeout)))
        registry.record("upload", upload)
        report("READY")
        hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 6_000_000)  # about 2 s in C: the SIGTERM comes
        print("RAN ON", flush=True)
        next(it)
        while True:
            time.sleep(0.1)
    if mode in ("weakref", "gc"):
        import gc
        import weakref

        globals()["kept"] = loader()  # alive at the end: the teardown shuts it down

        def callback(*_):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # bytecode for the handler to run in
                pass

        class Thing:
            pass

        if mode == "weakref":
            thing = Thing()
            weakref.finalize(thing, callback)
            report("READY")
            del thing
        else:
            gc.callbacks.append(callback)
            report("READY")
            gc.collect()
        while True:
            time.sleep(0.1)
    if mode == "with":
        import wandb

        with wandb.init(project="autoteardown-tests", name="main") as run:
            for step in range(10):
                run.log({"x": step})
            report("READY")
            while True:
                time.sleep(0.05)
    if mode == "lock":
        from autoteardown import threads

        it = loader()  # noqa: F841
        with threads._state.lock:  # the timers' lock, held by the main thread when the signal comes
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(50):
                time.sleep(0.1)
        return
    if mode == "uninstall":
        import autoteardown

        it = loader()  # noqa: F841
        time.sleep(0.2)
        autoteardown.uninstall()
        read_fd, write_fd = os.pipe()
        os.write(write_fd, b"mine")
        time.sleep(0.5)  # a stale helper thread would read the bytes meanwhile
        os.set_blocking(read_fd, False)
        try:
            got = os.read(read_fd, 16)
        except BlockingIOError:
            got = b""
        report("PIPE", got.decode() or "-")
        return
    if mode == "spawnchild":
        import multiprocessing

        child = multiprocessing.get_context("spawn").Process(target=spawn_child)
        child.start()
        child.join(120)
        report("CHILD", child.exitcode)
        return
    if mode == "dropped":
        it = loader()
        del it
        return
    if mode == "exitcodes":
        it = loader()  # noqa: F841
        try:
            sys.exit(2)
        except SystemExit:
            pass
        raise SystemExit(5)
    if mode == "spawnworker":
        it = loader(1, multiprocessing_context="spawn", worker_init_fn=spawn_worker_init)  # noqa: F841
        time.sleep(0.5)
        return
    if mode == "waitmain":
        globals()["kept"] = loader()  # alive at the end, as a trainer's loader is
        wait_for_main(sys.argv[2])
        report("END", time.monotonic())
        return
    if mode == "spawnwait":
        import multiprocessing

        child = multiprocessing.get_context("spawn").Process(target=spawn_wait, args=(sys.argv[2],))
        child.start()
        child.join()
        report("CHILD", child.exitcode)
        return
    if mode == "pool":
        from concurrent.futures import ProcessPoolExecutor

        it = loader()  # noqa: F841
        with ProcessPoolExecutor(2) as pool:
            futures = [pool.submit(square, n) for n in range(2)]
            time.sleep(1.0)
            report("PIDS", *pool._processes)
            report("READY")
            for future in futures:
                future.result()
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1])
