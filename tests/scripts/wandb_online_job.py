"""An unmodified script logging to W&B online (the tests' stand-in, WANDB_BASE_URL). Usage:
wandb_online_job.py ENDING

It logs STEPS steps, prints READY and waits for the file GO_FILE (the test stalls or stops
the server meanwhile), then ends by ENDING: normal, raise, exit3, finish (the script calls
run.finish() at its end), with (the run is a `with wandb.init()` block ending there), or
sigterm (it waits for the signal instead). Prints RUN: <run id> <run dir>, CORE: wandb-core."""

import os
import sys
import time

import psutil
import wandb

STEPS = 20
ending = sys.argv[1]


def wait_for_go():
    print("READY", flush=True)
    while not os.path.exists(os.environ["GO_FILE"]) and ending != "sigterm":
        time.sleep(0.05)
    while ending == "sigterm":
        time.sleep(0.1)


def log(run):
    for step in range(STEPS):
        run.log({"x": step})
    me = psutil.Process().pid
    cores = [p.pid for p in psutil.process_iter(["name", "ppid"]) if p.info["ppid"] == me and p.info["name"] == "wandb-core"]
    print("RUN:", run.id, run.dir, flush=True)
    print("CORE:", *cores, flush=True)
    wait_for_go()


if ending == "with":
    with wandb.init(project="autoteardown-tests") as run:
        log(run)
else:
    run = wandb.init(project="autoteardown-tests")
    log(run)
    if ending == "finish":
        run.finish()
    if ending == "raise":
        raise ValueError("the user's own error")
    if ending == "exit3":
        sys.exit(3)
