"""Lightning's graceful SIGTERM (tests/scripts/lightning_job.py): Trainer.fit composes the
SIGTERM handler it finds (the shim's, installed when `import lightning` imported
torch.utils.data) after its own notifier. Ours must return to it: Lightning then raises its
SIGTERMException at the end of the batch, runs on_exception hooks, OnExceptionCheckpoint
saves, and the process exits 0, as without the shim; the shim adds the wandb run's end
and the DataLoader workers' clean stop."""

import signal
import time

import pytest

from helpers import LOAD_MARGIN, noise, wait_for_line, wait_gone, wait_session_gone

pytest.importorskip("lightning")
pytestmark = pytest.mark.needs_torch


def fit_and_sigterm(jobs, tmp_path, shim):
    checkpoints = tmp_path / "checkpoints"
    proc = jobs.start("lightning_job.py", checkpoints, shim=shim, AUTOTEARDOWN_TIMEOUT=10)
    _, before = wait_for_line(proc, "READY", timeout=180)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    result = jobs.finish(proc, timeout=120, before=before)
    return result, checkpoints / "on_exception.ckpt"


def test_lightning_keeps_its_graceful_sigterm(jobs, tmp_path):
    result, checkpoint = fit_and_sigterm(jobs, tmp_path, shim=True)
    assert result.returncode == 0, result
    assert "ON_EXCEPTION: SIGTERMException" in result.stdout, result
    assert checkpoint.exists(), result
    [(name, steps, codes)] = jobs.runs()
    assert name == "main" and steps and codes == [0], result  # the run is complete, with the real status
    assert noise(result.stderr) == [], result
    pids = result.pids("PIDS") + result.pids("CORE")
    assert len(result.pids("PIDS")) == 2 and wait_gone(pids, within=LOAD_MARGIN) == [], result
    assert wait_session_gone(result.pid, within=LOAD_MARGIN) == [], result


@pytest.mark.baseline
def test_without_the_shim_lightning_ends_the_same_way(jobs, tmp_path):
    # The reference the shim must match (upstream behaviour: reported, not gating).
    result, checkpoint = fit_and_sigterm(jobs, tmp_path, shim=False)
    assert result.returncode == 0 and checkpoint.exists(), result
    assert "ON_EXCEPTION: SIGTERMException" in result.stdout, result
