"""DataLoader workers whose work outlives them (integrations/torch.py's worker rule): a worker is
ended as the process would end it without the shim, never sooner. Each test runs the same
script (tests/scripts/worker_effects_job.py) without the shim, then with it, and asserts: the
same exit status, no more item files truncated, the same SIGTERM handlers run to their end,
the job (the script and its workers) gone within x1.10 + 0.2 s of without (plus the load
margin), no "killed by signal", nothing left."""

import signal
import time

import pytest

from helpers import LOAD_MARGIN, reported, tracebacks, wait_for_line, wait_gone

pytestmark = pytest.mark.needs_torch
SIZE = 10_000  # a complete item file (the script's SIZE)


def job(jobs, mode, shim):
    """Run MODE to its end; (Run, seconds from the end (or the SIGTERM) until the script and its
    workers are gone, [truncated item files], how many handlers flushed, how many item files)."""
    folder = jobs.dir / f"{mode}-{'shim' if shim else 'none'}"
    folder.mkdir()
    proc = jobs.start("worker_effects_job.py", mode, folder, shim=shim)
    line, before = wait_for_line(proc, "PIDS:")
    workers = reported(line)
    jobs.track(workers)
    sent = None
    if mode == "sigterm":
        _, more = wait_for_line(proc, "READY")
        before += more
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # the main process alone
    result = jobs.finish(proc, timeout=60 + LOAD_MARGIN, before=before)
    assert wait_gone(workers, within=30 + LOAD_MARGIN) == [], result
    gone = time.monotonic()
    began = sent if sent is not None else float(result.stdout.split("END:")[1].split()[0])
    items = list(folder.glob("item-*"))
    truncated = sorted(p.name for p in items if p.stat().st_size < SIZE)
    return result, gone - began, truncated, len(list(folder.glob("flushed-*"))), len(items)


@pytest.mark.parametrize("mode, status", [("sigterm", -signal.SIGTERM), ("persistent", 0), ("handler", 0)])
def test_a_workers_effects_are_never_cut_shorter_than_without_the_shim(jobs, mode, status):
    without, took_without, truncated_without, flushed_without, _ = job(jobs, mode, shim=False)
    result, took, truncated, flushed, written = job(jobs, mode, shim=True)
    assert result.returncode == without.returncode == status, (result, without)
    assert len(truncated) <= len(truncated_without), (truncated, truncated_without, result)
    assert flushed >= flushed_without, (flushed, flushed_without, result)
    if mode == "handler":
        assert flushed == 2, result  # both workers were busy: each got SIGTERM and finished its handler
    else:
        assert truncated == [] and written > 0, (truncated, result)
    assert "killed by signal" not in result.stderr and tracebacks(result.stderr) == 0, result
    assert took < took_without * 1.10 + 0.2 + LOAD_MARGIN, (took, took_without, result)
