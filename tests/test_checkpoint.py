"""An async torch.distributed.checkpoint save in flight when the job ends: complete and
loadable with the shim (real DCP on gloo, 100 MB a rank; world size 1, or two ranks under
torchrun; the thread checkpointer, and the process one, whose writer is a spawn process)."""

import os
import re
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
    noise,
    scancel,
    wait_for_line,
    wait_for_ranks,
    wait_gone,
    wait_session_gone,
)

# The process checkpointer's writer joins a TCPStore on MASTER_ADDR (the host's name when
# unset, which a sandbox may not resolve); torchrun sets it.
PROCESS = {"CHECKPOINTER": "process", "MASTER_ADDR": "127.0.0.1"}

pytestmark = pytest.mark.needs_torch

MODES = {"sigterm": -signal.SIGTERM, "raise": 1, "exit3": 3}


def save(jobs, mode, shim=True, group=False, **env):
    """Run checkpoint_job.py; SIGTERM it (or its group) 0.3 s after async_save returned.
    (result, seconds from the signal to the end or None)."""
    proc = jobs.start("checkpoint_job.py", jobs.dir, mode, shim=shim, env=env)
    if mode not in ("sigterm", "slow"):
        return jobs.finish(proc, timeout=180), None
    _, before = wait_for_line(proc, "READY", timeout=120)
    time.sleep(0.3)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM) if group else proc.send_signal(signal.SIGTERM)
    result = jobs.finish(proc, timeout=120, before=before)
    return result, result.ended - sent


def loaded(jobs, ranks=1, megabytes=100):
    """What a fresh process loading the checkpoint finds: 'equal' to what was saved, or why not."""
    if not os.path.exists(jobs.dir / "ckpt" / ".metadata"):
        return "no .metadata"
    result = jobs.run("checkpoint_job.py", jobs.dir, "load", megabytes, shim=False, timeout=180, CHECKPOINT_RANKS=ranks)
    match = re.search(r"^LOADED: (\w+)", result.stdout, re.M)
    return match.group(1) if match else f"load failed: {result.stderr[-300:]}"


@pytest.mark.parametrize("mode", MODES)
def test_a_save_in_flight_completes_and_loads(jobs, mode):
    result, _ = save(jobs, mode)
    assert result.returncode == MODES[mode], result
    # torch's excepthook prefixes the user's own traceback with "[rank0]: ".
    assert noise(result.stderr) == [] and result.stderr.count("Traceback (most recent") == (mode == "raise"), result
    assert "autoteardown:" not in result.stderr, result
    assert loaded(jobs) == "equal", result


def test_a_sigterm_to_the_whole_process_group(jobs):
    result, _ = save(jobs, "sigterm", group=True)
    assert result.returncode == -signal.SIGTERM, result
    assert loaded(jobs) == "equal", result


def test_a_save_longer_than_its_budget_is_left_with_one_warning(jobs):
    # The writer sleeps 30 s before it writes: the process ends within the deadline.
    budget = 3
    result, took = save(jobs, "slow", AUTOTEARDOWN_TIMEOUT=budget)
    assert result.returncode == -signal.SIGTERM, result
    assert took < budget + 1 + LOAD_MARGIN, result
    lines = [line for line in result.stderr.splitlines() if line.startswith("autoteardown:")]
    assert len(lines) == 1 and "ckpt not complete after waiting" in lines[0] and "written" in lines[0], result


@pytest.mark.parametrize("mode", MODES)
def test_the_process_checkpointers_save_in_flight_completes_and_loads(jobs, mode):
    result, _ = save(jobs, mode, **PROCESS)
    assert result.returncode == MODES[mode], result
    assert "autoteardown:" not in result.stderr, result
    assert loaded(jobs) == "equal", result


def test_a_process_checkpointers_save_past_its_budget_is_left_to_its_writer(jobs):
    # The writer outlives its parent without the shim and finishes the save: the teardown
    # gives up waiting at its budget, and the process ends without ending the writer.
    budget, slow = 3, 8
    proc = jobs.start("checkpoint_job.py", jobs.dir, "slow", env={**PROCESS, "SLOW_WRITE_S": slow},
                      AUTOTEARDOWN_TIMEOUT=budget)
    _, before = wait_for_line(proc, "READY", timeout=120)
    deadline = time.monotonic() + 120
    while not (jobs.dir / "ckpt").exists() and time.monotonic() < deadline:  # the writer has the save
        time.sleep(0.05)
    writers = [p.pid for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    while proc.poll() is None and time.monotonic() < sent + budget + 1 + LOAD_MARGIN:
        time.sleep(0.02)
    took = time.monotonic() - sent
    result = jobs.finish(proc, timeout=slow + 60, before=before)  # its pipes close with the writer
    assert result.returncode == -signal.SIGTERM and took < budget + 1 + LOAD_MARGIN, (took, result)
    lines = [line for line in result.stderr.splitlines() if line.startswith("autoteardown:")]
    assert len(lines) == 1 and "not complete after waiting" in lines[0], result
    assert len(writers) == 1 and wait_gone(writers, within=LOAD_MARGIN) == [], writers
    assert loaded(jobs) == "equal", result


def test_an_idle_process_checkpointers_writer_ends_with_the_process(jobs):
    proc = jobs.start("checkpoint_job.py", jobs.dir, "waited", env=PROCESS)
    line, before = wait_for_line(proc, "PIDS", timeout=120)
    _, more = wait_for_line(proc, "READY", timeout=60)
    proc.send_signal(signal.SIGTERM)
    result = jobs.finish(proc, timeout=60, before=before + more)
    assert result.returncode == -signal.SIGTERM, result
    assert wait_gone([int(line.split()[1])], within=LOAD_MARGIN) == [], result
    assert "Traceback" not in result.stderr and "autoteardown:" not in result.stderr, result  # no EOFError from the writer
    assert loaded(jobs) == "equal", result


def test_a_sigterm_to_the_group_ends_the_process_checkpointers_writer_too(jobs):
    # torch's writer has no SIGTERM handler: the group's signal kills it mid-save, with or
    # without the shim, and the save is lost (docs/integrations.md says so). Ours: the
    # process still dies of the signal, within the deadline, the writer gone.
    result, took = save(jobs, "sigterm", group=True, **PROCESS)
    assert result.returncode == -signal.SIGTERM and took < 10 + LOAD_MARGIN, result
    assert wait_session_gone(result.pid, within=LOAD_MARGIN) == [], result
    print("process checkpointer, SIGTERM to the group:", loaded(jobs))


@pytest.mark.parametrize("target", ["scancel", "torchrun"])
@pytest.mark.parametrize("shim", [True, pytest.param(False, marks=pytest.mark.baseline)])
def test_two_ranks_under_torchrun_stopped_mid_save(jobs, shim, target):
    """Mid-save, torchrun and both ranks get SIGTERM at once (scancel), or torchrun's process
    group does (torchrun hands it on to each rank's own group): the checkpoint holds both
    ranks' shards and loads."""
    proc = jobs.popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                       "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                       str(SCRIPTS / "checkpoint_job.py"), str(jobs.dir), "sigterm", "50"],
                      env=base_env(shim=shim, **jobs.env(OMP_NUM_THREADS=1)),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = wait_for_ranks(proc, timeout=180)
    time.sleep(0.3)
    if target == "scancel":
        job = scancel(proc.pid)
    else:
        job = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
        os.killpg(proc.pid, signal.SIGTERM)
    result = jobs.finish(proc, timeout=120, before="".join(seen))
    assert result.returncode != 0, result  # torchrun's own report of its stopped ranks
    assert wait_gone(job, within=LOAD_MARGIN) == [], result
    assert (loaded(jobs, ranks=2, megabytes=50) == "equal") is shim, result  # the baseline: lost


@pytest.mark.baseline
@pytest.mark.parametrize("checkpointer", ["thread", "process"])
def test_without_the_shim_a_sigterm_loses_the_save(jobs, checkpointer):
    result, _ = save(jobs, "sigterm", shim=False, **(PROCESS if checkpointer == "process" else {}))
    assert result.returncode == -signal.SIGTERM, result
    assert loaded(jobs) != "equal", result


@pytest.mark.parametrize("shim", [True, False])
def test_a_save_stuck_on_a_collective_is_given_up_without_its_budget(jobs, shim):
    """Two ranks train in an all_reduce loop on the group the save's own collectives use: they
    cross, and the save never completes (before any signal). Every process of the job is then
    signalled at once: with the shim the ranks are gone within the SIGTERM's wait for the main
    thread (stuck in the collective) and the save's STALL_S, far inside the budget; the status
    is torchrun's as without the shim, and no .metadata either way."""
    from autoteardown.deadlines import WAIT_FOR_MAIN_THREAD
    from autoteardown.integrations.checkpoint import STALL_S

    budget = 30
    proc = jobs.popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                       "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                       str(SCRIPTS / "checkpoint_job.py"), str(jobs.dir), "crossed", "50"],
                      env=base_env(shim=shim, **jobs.env(OMP_NUM_THREADS=1, AUTOTEARDOWN_TIMEOUT=budget)),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = wait_for_ranks(proc, timeout=180)
    time.sleep(1.5)  # the save is stuck by then
    sent = time.monotonic()
    job = scancel(proc.pid)
    assert wait_gone(job, within=budget + LOAD_MARGIN) == []
    took = time.monotonic() - sent
    result = jobs.finish(proc, timeout=60, before="".join(seen))
    print(f"shim={shim}: every process gone {took:.2f}s after the signal, status {result.returncode}")
    assert result.returncode != 0 and not os.path.exists(jobs.dir / "ckpt" / ".metadata"), result
    if shim:
        assert took < WAIT_FOR_MAIN_THREAD + STALL_S + LOAD_MARGIN, (took, result)
        assert "no progress for" in result.stderr, result
