"""An unmodified script logging to wandb. Usage: wandb_job.py RUNS ENDING

RUNS:   one; two (reinit="create_new", never finished); finished (two, the
        first finished by the user with exit code 7); tracker (verl-style:
        finished only in a module global's __del__); late (the user finishes in
        an atexit callback registered before wandb.init); teardown (the user
        calls wandb.teardown()); fork (a raw fork child ends normally);
        late_import (the run starts before `import autoteardown`);
        unsupported (says whether wandb.init is patched; the test fakes the version).
ENDING: normal, raise, exit3, systemexit3, interrupt, sigterm (waits after
        logging), killcore (SIGKILLs wandb-core, then ends), killcore_log (then
        catches the error of its own wandb.log call).

Each run logs STEPS history steps. Prints "CORE: pid" for wandb-core, and
with killcore "END: time.monotonic()" when the script's own code is done.
"""

import atexit
import os
import signal
import sys
import time

import psutil
import wandb

STEPS = 10
what, ending = sys.argv[1], sys.argv[2]


def start(**kwargs):
    run = wandb.init(project="autoteardown-tests", **kwargs)
    for step in range(STEPS):
        run.log({"x": step})
    return run


class Tracker:
    """As verl's Tracking: holds the wandb module and finishes in __del__."""

    def __init__(self):
        wandb.init(project="autoteardown-tests")
        self.logger = {"wandb": wandb}

    def log(self, data, step):
        self.logger["wandb"].log(data=data, step=step)

    def __del__(self):
        if "wandb" in self.logger:
            self.logger["wandb"].finish(exit_code=0)


if what == "one":
    run = start()
elif what == "two":
    run = start(reinit="create_new")
    second = start(reinit="create_new")
elif what == "finished":
    first = start(reinit="create_new")
    first.finish(exit_code=7)
    run = start(reinit="create_new")
elif what == "tracker":
    TRACKER = Tracker()
    for step in range(STEPS):
        TRACKER.log({"x": step}, step)
elif what == "late":
    atexit.register(lambda: run.finish())
    run = start()
elif what == "teardown":
    run = start()
    wandb.teardown()
elif what == "fork":
    run = start()
    child = os.fork()
    if child == 0:
        sys.exit(0)  # a raw fork child ending through the normal exit path
    os.waitpid(child, 0)
    for step in range(STEPS, 2 * STEPS):
        run.log({"x": step})
elif what == "late_import":
    run = start()
    import autoteardown  # noqa: F401  (from PYTHONPATH, not the sitecustomize)
elif what == "unsupported":
    print("PATCHED:", hasattr(wandb.init, "__wrapped__"), flush=True)
    run = start()

cores = [p.pid for p in psutil.process_iter(["name", "ppid"]) if p.info["ppid"] == psutil.Process().pid and p.info["name"] == "wandb-core"]
print("CORE:", *cores, flush=True)

if ending == "raise":
    raise ValueError("the user's own error")
if ending == "exit3":
    sys.exit(3)
if ending == "systemexit3":
    raise SystemExit(3)
if ending == "interrupt":
    raise KeyboardInterrupt
if ending == "sigterm":
    print("READY", flush=True)
    while True:
        time.sleep(0.1)
if ending.startswith("killcore"):
    time.sleep(0.5)  # wandb-core reads what is in flight (else asyncio warns of each lost write)
    core = psutil.Process(cores[0])
    core.send_signal(signal.SIGKILL)
    while core.status() != psutil.STATUS_ZOMBIE:  # dead, left for wandb to reap
        time.sleep(0.01)
    time.sleep(0.5)  # so that wandb's reader thread sees the connection drop
    if ending == "killcore_log":
        try:
            run.log({"x": STEPS})
        except Exception:
            print("LOG FAILED", flush=True)
    # Not through sys.stdout, which wandb still sends to the dead wandb-core.
    os.write(1, f"END: {time.monotonic()}\n".encode())
