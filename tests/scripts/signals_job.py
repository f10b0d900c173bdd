"""Unmodified scripts meeting SIGTERM, SystemExit and interrupts. Usage: signals_job.py MODE

MODE:
  twice        StatefulDataLoader(num_workers=4) + a wandb run, then waits: the test
               sends two SIGTERMs 50 ms apart
  swallow      a wandb run, then a loop that catches BaseException and goes on
  chained      a wandb run, then a handler chaining to the one it finds (ours): it
               calls it first, then "saves" and sys.exit(0)s, as ddtrace-style chaining does
  midwrite     a wandb run; the signal comes while wandb's console capture hands a line to its
               asyncio thread (argv[2]: "ours", our handler; "chained", the chained handler above)
  pool         a fork-context multiprocessing Pool whose task is stuck in C code;
               prints how long pool.terminate() took
  rawfork      an os.fork() child stuck in C code gets SIGTERM; prints how it ended
  argparse     a wandb run; argparse fails inside try/except SystemExit; normal end
  stale        a wandb run; an embedded console shows an error (sys.last_value set); normal end
  offmain      wandb imported in a thread (so armed off the main thread), the run
               started in the main thread, then waits for SIGTERM
  hung         an extra resource kind (fault injection) whose finalizer hangs, ahead
               of a wandb run; sys.exit(3)
  exit_sigterm DataLoader workers (if torch is here), an extra kind whose finalizer
               sends the process SIGTERM during the normal exit teardown, a wandb run
  interrupt    the user's autoteardown.finalize() is interrupted by Ctrl-C (an extra
               kind's finalizer sends SIGINT); the script catches it and ends normally

Prints PIDS: (DataLoader workers), CORE: (wandb-core), READY when waiting for a signal,
EXITING: time.monotonic() when its own code is done.
"""

import os
import signal
import sys
import threading
import time

STEPS = 10
mode = sys.argv[1]


def report(tag, *values):
    print(f"{tag}:", *values, flush=True)


def start_run():
    import psutil
    import wandb

    run = wandb.init(project="autoteardown-tests", name="main")
    for step in range(STEPS):
        run.log({"x": step})
    report("CORE", *[p.pid for p in psutil.process_iter(["name", "ppid"]) if p.info["ppid"] == psutil.Process().pid and p.info["name"] == "wandb-core"])
    return run


def stuck_in_c():
    # A second lock of a plain pthread mutex: Python signal handlers cannot run.
    import ctypes

    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)


class Resource:
    pass


KEPT = []  # the registry holds weak references only


def extra_kind(name, finalize_one, order=5):
    # Fault injection: a resource kind of our own, registered with the engine.
    from autoteardown import engine, registry

    engine.register_kind(name, order, finalize_one)
    KEPT.append(Resource())
    registry.record(name, KEPT[-1])


def exiting():
    report("EXITING", time.monotonic())


def chain_a_handler():
    # Calls the handler it replaces (ours) first, then "saves" and exits 0, as ddtrace-style chaining does.
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        if callable(previous):
            previous(signum, frame)
        report("SAVED", "checkpoint")
        sys.exit(0)

    signal.signal(signal.SIGTERM, handler)


def wait_for_signal():
    print("READY", flush=True)
    while True:
        time.sleep(0.05)


if mode == "twice":
    from torchdata.stateful_dataloader import StatefulDataLoader

    it = iter(StatefulDataLoader(list(range(10_000)), batch_size=4, num_workers=4))
    next(it)
    report("PIDS", *[w.pid for w in it._workers])
    run = start_run()
    print("READY", flush=True)
    while True:
        next(it)
        time.sleep(0.01)
elif mode == "swallow":
    run = start_run()
    ready = False
    while True:
        try:
            if not ready:
                ready = True
                print("READY", flush=True)  # inside the try: a SIGTERM during print() is swallowed too
            time.sleep(0.05)
        except BaseException:
            report("SWALLOWED", time.monotonic())
elif mode == "chained":
    run = start_run()
    chain_a_handler()
    wait_for_signal()
elif mode == "midwrite":
    import asyncio

    run = start_run()
    if sys.argv[2] == "chained":
        chain_a_handler()
    handing_over = asyncio.run_coroutine_threadsafe
    held = []

    def held_open(coro, loop):
        # wandb has counted the task, not yet handed it over: the window a signal can land in,
        # held open until it comes (a real signal; only its timing is arranged).
        if held and threading.current_thread() is threading.main_thread():
            held.clear()
            os.write(1, b"\nREADY\n")  # not through sys.stdout: wandb would capture it here
            while True:
                time.sleep(0.05)
        return handing_over(coro, loop)

    asyncio.run_coroutine_threadsafe = held_open
    held.append(True)
    print("a line wandb's console capture sends to wandb-core")
elif mode == "pool":
    import multiprocessing

    import wandb  # noqa: F401  (arms autoteardown, as a training script's imports do)

    def task(path):
        open(path, "w").close()
        stuck_in_c()

    marker = sys.argv[2]
    pool = multiprocessing.get_context("fork").Pool(2)
    pool.apply_async(task, (marker,))
    while not os.path.exists(marker):
        time.sleep(0.01)
    started = time.monotonic()
    pool.terminate()
    report("TERMINATE", f"{time.monotonic() - started:.3f}")
elif mode == "rawfork":
    import wandb  # noqa: F401

    child = os.fork()
    if child == 0:
        stuck_in_c()
    time.sleep(0.5)
    started = time.monotonic()
    os.kill(child, signal.SIGTERM)
    while time.monotonic() - started < 30:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            report("CHILD", os.waitstatus_to_exitcode(status), f"{time.monotonic() - started:.3f}")
            break
        time.sleep(0.01)
    else:
        os.kill(child, signal.SIGKILL)
        report("CHILD", "alive")
elif mode == "argparse":
    import argparse

    run = start_run()
    try:
        argparse.ArgumentParser().parse_args(["--no-such-option"])
    except SystemExit:
        report("CAUGHT", "SystemExit")
elif mode == "stale":
    import code

    run = start_run()
    # An embedded console shows an error and sets sys.last_value, as the REPL and IPython do.
    code.InteractiveInterpreter().runsource("1 / 0")
elif mode == "offmain":
    importer = threading.Thread(target=lambda: __import__("wandb"))
    importer.start()
    importer.join()
    run = start_run()
    wait_for_signal()
elif mode == "hung":
    extra_kind("hangs", lambda obj, timeout: time.sleep(3600))
    run = start_run()
    exiting()
    sys.exit(3)
elif mode == "exit_sigterm":
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader

        it = iter(StatefulDataLoader(list(range(10_000)), batch_size=4, num_workers=2))
        next(it)
        report("PIDS", *[w.pid for w in it._workers])
    except ImportError:
        pass

    def sigterm_now(obj, timeout):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)

    extra_kind("sends_sigterm", sigterm_now, order=12)  # after DataLoader workers (10)
    run = start_run()
    exiting()
elif mode == "interrupt":
    import autoteardown

    def interrupt_me(obj, timeout):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)

    extra_kind("interrupts", interrupt_me)
    run = start_run()
    try:
        autoteardown.finalize()
        report("NOT", "INTERRUPTED")
    except KeyboardInterrupt:
        report("INTERRUPTED", "KeyboardInterrupt")
    report("LIVE", *sorted(autoteardown.live()))
