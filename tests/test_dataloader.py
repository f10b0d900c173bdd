"""DataLoader worker iterators alive at exit, through the sitecustomize example."""

import signal
import time

import pytest

from helpers import finish, noise, run, start, tracebacks, wait_for_line, wait_gone


@pytest.mark.parametrize("mode, status", [("normal", 0), ("exit3", 3), ("raise", 1),
                                          ("interrupt", -signal.SIGINT)])
def test_workers_shut_down_cleanly(mode, status):
    result = run("dataloader_job.py", mode)
    assert result.returncode == status, result
    assert "killed by signal" not in result.stderr, result
    assert noise(result.stderr) == [], result
    # Only the user's own traceback, when there is one.
    assert tracebacks(result.stderr) == (1 if mode in ("raise", "interrupt") else 0), result
    if mode == "raise":
        assert "ValueError: the user's own error" in result.stderr
    assert len(result.pids()) == 4
    assert wait_gone(result.pids(), within=1.0) == []


def test_without_the_shim_the_workers_are_killed_by_signal():
    result = run("dataloader_job.py", "normal", shim=False)
    assert "killed by signal" in result.stderr, result


def test_sigterm_mid_epoch():
    proc = start("dataloader_job.py", "sigterm")
    pids_line, _ = wait_for_line(proc, "PIDS:")
    wait_for_line(proc, "READY")
    proc.send_signal(signal.SIGTERM)
    result = finish(proc, timeout=30)
    assert result.returncode == -signal.SIGTERM, result
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result
    pids = [int(p) for p in pids_line.split(":")[1].split()]
    assert wait_gone(pids, within=1.0) == []


def test_sigterm_while_the_main_thread_is_stuck_in_c_code():
    proc = start("dataloader_job.py", "stuck")
    pids_line, _ = wait_for_line(proc, "PIDS:")
    wait_for_line(proc, "READY")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    result = finish(proc, timeout=30)
    assert result.returncode == -signal.SIGTERM, result
    assert time.monotonic() - sent < 5, result
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result
    pids = [int(p) for p in pids_line.split(":")[1].split()]
    assert wait_gone(pids, within=1.0) == []


def test_fork_child_exit_leaves_the_parents_workers_alone():
    result = run("dataloader_job.py", "fork")
    assert result.returncode == 0, result
    assert "PARENT DONE" in result.stdout, result
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result
    assert wait_gone(result.pids(), within=1.0) == []


def test_fork_child_exit_kills_the_parents_workers_without_the_shim():
    result = run("dataloader_job.py", "fork", shim=False)
    assert result.returncode != 0, result
    assert "killed by signal: Terminated" in result.stderr, result


def test_a_raising_and_a_hanging_finalizer_do_not_stop_the_others():
    proc = start("dataloader_job.py", "faults", env={"AUTOTEARDOWN_TIMEOUT": 3})
    wait_for_line(proc, "PIDS:")
    wait_for_line(proc, "EXITING")
    began = time.monotonic()
    result = finish(proc, timeout=30)
    assert time.monotonic() - began < 3 + 1, result
    assert result.returncode == 0, result
    assert "killed by signal" not in result.stderr and tracebacks(result.stderr) == 0, result
    assert "RuntimeError: injected" in result.stderr  # one warning line, no traceback
    assert "left behind" in result.stderr
    assert wait_gone(result.pids(), within=1.0) == []
