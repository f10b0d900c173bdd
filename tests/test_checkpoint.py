"""An async torch.distributed.checkpoint save in flight when the job ends: complete and
loadable with the shim (real DCP on gloo, world size 1, the thread checkpointer, 100 MB)."""

import os
import re
import signal
import time

import pytest

from helpers import LOAD_MARGIN, noise, wait_for_line

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


def loaded(jobs):
    """What a fresh process loading the checkpoint finds: 'equal' to what was saved, or why not."""
    if not os.path.exists(jobs.dir / "ckpt" / ".metadata"):
        return "no .metadata"
    result = jobs.run("checkpoint_job.py", jobs.dir, "load", shim=False, timeout=180)
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


@pytest.mark.baseline
def test_without_the_shim_a_sigterm_loses_the_save(jobs):
    result, _ = save(jobs, "sigterm", shim=False)
    assert result.returncode == -signal.SIGTERM, result
    assert loaded(jobs) != "equal", result
