"""Jobs stopped the way schedulers stop them (docs/integrations.md, "On SLURM and Kubernetes"):
tests/scripts/scheduler_job.py (a wandb run, offline, and a DataLoader with 2 workers, a step
every 50 ms) under `python` or `torchrun --nproc-per-node 2`.

- SLURM's stop (time limit, preemption, `scancel`): every process of the job at once, the
  launcher and all its descendants whatever their session, wandb-core included. wandb-core
  then drops what it has not written: a kept run is impossible from outside (the docs say why),
  so that test gates on what the shim owns (status, time, no "killed by signal", nothing left)
  and reports the run.
- The documented recipe (`--signal=B:TERM@N`, tests/scripts/slurm_batch.sh): the batch shell
  alone is signalled and hands it on to the launcher: every run keeps every step it logged and
  its exit record 143.
- Kubernetes: the script as PID 1 of its container (`unshare --pid`), whose SIGTERM the kernel
  drops unless it has a handler.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers import (
    LOAD_MARGIN,
    SCRIPTS,
    base_env,
    free_port,
    in_session,
    read_until,
    scancel,
    tracebacks,
    wait_for_line,
    wait_for_ranks,
    wait_gone,
)

pytest.importorskip("wandb")
pytestmark = pytest.mark.needs_torch
TIMEOUT = 10.0  # AUTOTEARDOWN_TIMEOUT here
RANKS = {"python": 1, "torchrun": 2}
# torchrun's own tracebacks (the signal it got, or its stopped ranks, as its timing decides: not ours to count)
TORCHRUN_ERROR = re.compile(r"^torch\.distributed\.elastic\.\S+(?:Exception|Error):", re.M)


def ours(stderr):
    """The tracebacks in stderr that are not torchrun's own."""
    return tracebacks(stderr) - len(TORCHRUN_ERROR.findall(stderr))


def launch(jobs, launcher, shim=True, batch=False):
    """Start the job; (proc, the lines read until every rank is READY)."""
    command = [sys.executable, str(SCRIPTS / "scheduler_job.py")]
    if launcher == "torchrun":
        command[1:1] = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                        "--master-port", str(free_port())]
    if batch:
        command = ["/bin/bash", str(SCRIPTS / "slurm_batch.sh"), *command]
    proc = jobs.popen(command, env=base_env(shim=shim, **jobs.env(OMP_NUM_THREADS=1, AUTOTEARDOWN_TIMEOUT=TIMEOUT)),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, wait_for_ranks(proc, ranks=RANKS[launcher], timeout=180)


def stop(jobs, proc, seen, everyone):
    """SIGTERM to every process of the job at once (SLURM's stop), or to the first alone; (Run,
    seconds from the signal until every process of the job is gone, what is left then)."""
    sent = time.monotonic()
    job = scancel(proc.pid, everyone)
    jobs.track(job)
    result = jobs.finish(proc, timeout=60 + TIMEOUT, before="".join(seen))
    left = wait_gone(job, within=TIMEOUT + 3 - (time.monotonic() - sent)) + in_session(proc.pid)
    return result, time.monotonic() - sent, left


def logged(stdout):
    """{run name: steps the script logged}, from its LOGGED lines."""
    last = {}
    for rank, step in re.findall(r"LOGGED (\d+) (\d+)", stdout):
        last[f"rank{rank}"] = max(last.get(f"rank{rank}", -1), int(step))
    return {name: step + 1 for name, step in last.items()}


def kept(jobs, result):
    """[(run name, steps in its run file, of those it logged, its exit records)], one a run file. A
    step logged as the signal came may be in the file without its LOGGED line: it counts as logged."""
    counts = logged(result.stdout)
    found = []
    for name, steps, codes in jobs.runs():
        count = counts.get(name, 0)
        if steps == list(range(count + 1)):
            count += 1
        found.append((name, len(steps) if steps == list(range(len(steps))) else -1, count, codes))
    return found


@pytest.mark.parametrize("launcher", RANKS)
def test_every_process_signalled_at_once(jobs, launcher):
    proc, seen = launch(jobs, launcher)
    result, took, left = stop(jobs, proc, seen, everyone=True)
    print(f"{launcher}, every process signalled: runs {kept(jobs, result)}, gone in {took:.2f}s")
    assert left == [] and took < TIMEOUT + 3, (took, left, result)
    assert "killed by signal" not in result.stderr, result.stderr
    assert ours(result.stderr) == 0, result.stderr
    # The script dies of the signal; torchrun reports its stopped ranks its own way (1 here, with
    # or without the shim).
    assert result.returncode == -signal.SIGTERM if launcher == "python" else result.returncode != 0, result


@pytest.mark.baseline
@pytest.mark.parametrize("launcher", RANKS)
def test_without_the_shim_every_process_signalled_loses_the_runs(jobs, launcher):
    proc, seen = launch(jobs, launcher, shim=False)
    result, _, _ = stop(jobs, proc, seen, everyone=True)
    runs = kept(jobs, result)
    assert len(runs) == RANKS[launcher] and all(steps < logged or codes != [143] for _, steps, logged, codes in runs), runs


@pytest.mark.parametrize("launcher", RANKS)
def test_the_slurm_recipe_keeps_every_run(jobs, launcher):
    """`#SBATCH --signal=B:TERM@N`: the batch shell alone is signalled; it hands the signal on."""
    proc, seen = launch(jobs, launcher, batch=True)
    result, took, left = stop(jobs, proc, seen, everyone=False)
    runs = kept(jobs, result)
    assert len(runs) == RANKS[launcher] and all(
        steps == logged and codes == [143] for _, steps, logged, codes in runs), (runs, result)
    assert left == [] and took < TIMEOUT + 3, (took, left, result)
    assert "killed by signal" not in result.stderr, result.stderr
    assert ours(result.stderr) == 0, result.stderr
    assert result.returncode == 128 + signal.SIGTERM if launcher == "python" else result.returncode != 0, result


def test_a_killed_script_leaves_no_wandb_core(jobs):
    # The OOM killer, a SIGKILL: no teardown; wandb-core ends when its parent is gone.
    proc, seen = launch(jobs, "python")
    core = [int(pid) for line in seen if line.startswith("CORE:") for pid in line.split()[1:]]
    proc.kill()
    jobs.finish(proc, timeout=60)
    assert len(core) == 1 and wait_gone(core, within=30) == [], core


def pid_1_stopped(jobs, shim):
    """wandb_job.py as PID 1 of its PID namespace (a container's), sent SIGTERM from outside it, as
    the kubelet does; (seconds until it ended, or TIMEOUT + LOAD_MARGIN if it runs on, the Run)."""
    proc = jobs.popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable,
                       str(SCRIPTS / "wandb_job.py"), "one", "sigterm"],
                      env=base_env(shim=shim, **jobs.env(AUTOTEARDOWN_TIMEOUT=TIMEOUT)),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, before = wait_for_line(proc, "READY", timeout=120)
    init = psutil.Process(proc.pid).children()[0]
    sent = time.monotonic()
    init.send_signal(signal.SIGTERM)
    try:
        init.wait(TIMEOUT + LOAD_MARGIN)
    except psutil.TimeoutExpired:
        pass
    took = time.monotonic() - sent
    proc.kill()  # --kill-child: the namespace's processes go with it
    return took, jobs.finish(proc, timeout=60, before=before)


NO_UNSHARE = pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare, root")


@NO_UNSHARE
def test_pid_1_of_a_container_ends_on_sigterm(jobs):
    """The kernel drops a SIGTERM to a PID namespace's init that has no handler for it; the shim's
    handler takes it: the job ends within the deadline, with the run's exit record 143."""
    took, result = pid_1_stopped(jobs, shim=True)
    assert took < TIMEOUT + LOAD_MARGIN, (took, result)
    assert [codes for _, _, codes in jobs.runs()] == [[143]], result


@NO_UNSHARE
@pytest.mark.baseline
def test_without_the_shim_pid_1_runs_on_after_sigterm(jobs):
    took, result = pid_1_stopped(jobs, shim=False)
    assert took >= TIMEOUT + LOAD_MARGIN, (took, result)


@pytest.mark.parametrize("shim", [True, False])
def test_a_local_ray_with_every_process_signalled_is_measured(jobs, shim):
    """verl's shape inside a SLURM job: `ray.init()` in the script, a TaskRunner actor logging to
    wandb; every process of the job signalled at once (the driver, raylet, GCS, the workers,
    wandb-core). Reported, not gated: wandb-core drops what it has not written, whoever ends the
    run (docs/integrations.md states the figures and the limit). What the shim owns is gated:
    the driver ends with the status it has without the shim (1, or Ray's abort) and within the
    deadline; the actor's own processes are gone; Ray's agents, which ignore SIGTERM, are left to
    SLURM's SIGKILL with or without the shim and are killed here by pid."""
    proc = jobs.start("ray_stopped_job.py", 40, 0.2, "wandb", shim=shim, env={"AUTOTEARDOWN_TIMEOUT": TIMEOUT})
    before = read_until(proc, r"STEP: 10\b")
    sent = time.monotonic()
    job = scancel(proc.pid)
    jobs.track(job)
    result = jobs.finish(proc, timeout=60 + TIMEOUT, before=before)
    took = time.monotonic() - sent
    seen = [int(n) for n in re.findall(r"STEP: (\d+)", result.stdout)]
    actor = [int(p) for tag in ("ACTOR", "CHILDREN") for p in re.findall(rf"{tag}: ([\d ]+)", result.stdout)
             for p in p.split()]
    left = wait_gone(actor, within=LOAD_MARGIN)
    others = wait_gone(job, within=0)
    print(f"local Ray, every process signalled, shim={shim}: driver status {result.returncode} in {took:.2f}s; "
          f"steps seen {max(seen) + 1}, run files {[(len(s), c) for _, s, c in jobs.runs()]}; "
          f"the actor's processes left {left}; Ray's left {len(others)}")
    assert result.returncode != 0 and took < TIMEOUT + 3, (took, result)
    assert left == [], result
