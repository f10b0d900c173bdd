"""DataLoader worker iterators alive at exit, through the sitecustomize example.
(A raising and a hanging finalizer next to DataLoader workers: test_faults.py.)"""

import signal
import time

import pytest

from helpers import LOAD_MARGIN, noise, tracebacks, wait_for_line, wait_gone

pytestmark = pytest.mark.needs_torch

TIMEOUT = 3.0  # AUTOTEARDOWN_TIMEOUT for the runs that time the exit


@pytest.mark.parametrize("mode, status", [("normal", 0), ("exit3", 3), ("raise", 1),
                                          ("interrupt", -signal.SIGINT)])
def test_workers_shut_down_cleanly(jobs, mode, status):
    result = jobs.run("dataloader_job.py", mode)
    assert result.returncode == status, result
    assert "killed by signal" not in result.stderr, result
    assert noise(result.stderr) == [], result
    # Only the user's own traceback, when there is one.
    assert tracebacks(result.stderr) == (1 if mode in ("raise", "interrupt") else 0), result
    if mode == "raise":
        assert "ValueError: the user's own error" in result.stderr
    assert len(result.pids()) == 4
    assert wait_gone(result.pids(), within=LOAD_MARGIN) == []


@pytest.mark.baseline
def test_without_the_shim_the_workers_are_killed_by_signal(jobs):
    result = jobs.run("dataloader_job.py", "normal", shim=False)
    assert "killed by signal" in result.stderr, result


def sigterm(jobs, mode, **env):
    proc = jobs.start("dataloader_job.py", mode, **env)
    line, before = wait_for_line(proc, "PIDS:")
    _, more = wait_for_line(proc, "READY")
    jobs.track_reported(line)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    result = jobs.finish(proc, timeout=60, before=before + more)
    return result, time.monotonic() - sent


def test_sigterm_mid_epoch(jobs):
    result, _ = sigterm(jobs, "sigterm")
    assert result.returncode == -signal.SIGTERM, result
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result
    assert wait_gone(result.pids(), within=LOAD_MARGIN) == []


def test_sigterm_while_the_main_thread_is_stuck_in_c_code(jobs):
    # The helper thread takes over when the main thread cannot run the handler: the
    # process ends within its wait for the main thread and the teardown deadline.
    from autoteardown.deadlines import WAIT_FOR_MAIN_THREAD as wait
    result, took = sigterm(jobs, "stuck", AUTOTEARDOWN_TIMEOUT=TIMEOUT)
    assert result.returncode == -signal.SIGTERM, result
    assert took < wait + TIMEOUT + LOAD_MARGIN, result
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result
    assert wait_gone(result.pids(), within=LOAD_MARGIN) == []


def test_fork_child_exit_leaves_the_parents_workers_alone(jobs):
    result = jobs.run("dataloader_job.py", "fork")
    assert result.returncode == 0, result
    assert "PARENT DONE" in result.stdout, result
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result
    assert wait_gone(result.pids(), within=LOAD_MARGIN) == []


@pytest.mark.baseline
def test_fork_child_exit_kills_the_parents_workers_without_the_shim(jobs):
    result = jobs.run("dataloader_job.py", "fork", shim=False)
    assert result.returncode != 0, result
    assert "killed by signal: Terminated" in result.stderr, result


@pytest.mark.parametrize("ending, status, held", [("normal", 0, False), ("raise", 1, False), ("normal", 0, True)],
                         ids=["normal", "raise", "a worker dies holding the done event's lock"])
def test_the_exit_never_waits_for_an_item_being_loaded(jobs, ending, status, held):
    # Items take 60 s and the budget is 30 s: a wait for the item (or for half the budget), or
    # for a lock an ended worker took with it, would hold the exit far past the bound, which is
    # the workers' grace and the margin.
    from autoteardown.integrations import torch as integration

    grace = getattr(integration, "WORKER_GRACE", 0.5)
    result = jobs.run("slow_items_job.py", 60, ending, *["held"] * held, env={"AUTOTEARDOWN_TIMEOUT": 30})
    assert result.returncode == status, result
    assert "killed by signal" not in result.stderr and noise(result.stderr) == [], result
    assert tracebacks(result.stderr) == (ending == "raise"), result
    end = float(result.stdout.split("END:")[1].split()[0])
    assert result.ended - end < 2 * grace + LOAD_MARGIN, result
    assert wait_gone(result.pids(), within=LOAD_MARGIN) == []
