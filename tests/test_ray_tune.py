"""Ray Tune: every trial's run ends with its steps and an exit record when the experiment is
stopped, and `fit()` does not wait out the logger callback's upload timeout (ray_tune.py).

Each script starts its own local Ray and two trials logging to wandb (offline) through
WandbLoggerCallback, with an upload timeout of 60 s; the driver is stopped once both trials
are at their sixth step. What each run must hold is what Tune recorded for its trial
(progress.csv)."""

import csv
import signal
import time

import pytest

from helpers import LOAD_MARGIN, noise, wait_for_line

pytest.importorskip("ray.tune", exc_type=ImportError)
pytest.importorskip("ray.air.integrations.wandb", exc_type=ImportError)

TIMEOUT = 10.0  # AUTOTEARDOWN_TIMEOUT's default
UPLOAD_TIMEOUT = 60


def stopped_experiment(jobs, signum, shim=True):
    """Run tune_job.py, send `signum` once both trials are at step 5: (result, monotonic time sent)."""
    proc = jobs.start("tune_job.py", shim=shim, env={"TUNE_DIR": jobs.dir, "UPLOAD_TIMEOUT": UPLOAD_TIMEOUT})
    _, before = wait_for_line(proc, "READY", timeout=120)
    until = time.monotonic() + 120
    while len(list(jobs.dir.glob("step5-*"))) < 2 and time.monotonic() < until and proc.poll() is None:
        time.sleep(0.1)
    sent = time.monotonic()
    proc.send_signal(signum)
    return jobs.finish(proc, timeout=UPLOAD_TIMEOUT + 120, before=before), sent


def tune_results(jobs):
    """Each trial's reported iterations, as Tune recorded them, sorted."""
    found = []
    for path in sorted(jobs.dir.glob("exp/*/progress.csv")):
        with open(path) as rows:
            found.append(sorted(int(row["training_iteration"]) for row in csv.DictReader(rows)))
    return sorted(found)


def test_ctrl_c_ends_every_trials_run_without_the_upload_wait(jobs):
    result, sent = stopped_experiment(jobs, signal.SIGINT)
    returned = float(result.stdout.split("FIT_RETURNED")[1].split()[0])
    assert returned - sent < TIMEOUT + 5 + LOAD_MARGIN, result  # not UPLOAD_TIMEOUT
    runs = jobs.runs()
    assert len(runs) == 2 and all(codes == [0] for _, _, codes in runs), result  # as Tune ends each run
    iterations = tune_results(jobs)
    assert len(iterations) == 2 and all(iterations), result
    # wandb's step is Tune's training_iteration: every result Tune recorded is in its run.
    assert sorted(steps for _, steps, _ in runs) == iterations, result
    assert noise(result.stderr) == [] and "autoteardown:" not in result.stderr, result


def test_sigterm_ends_every_trials_run_with_143(jobs):
    result, _ = stopped_experiment(jobs, signal.SIGTERM)
    runs = jobs.runs()
    assert len(runs) == 2, result
    assert all(steps and codes == [143] for _, steps, codes in runs), result


@pytest.mark.baseline
def test_without_the_shim_ctrl_c_waits_out_the_upload_timeout_and_loses_the_runs(jobs):
    result, sent = stopped_experiment(jobs, signal.SIGINT, shim=False)
    returned = float(result.stdout.split("FIT_RETURNED")[1].split()[0])
    assert returned - sent >= UPLOAD_TIMEOUT, result
    assert all(codes == [] for _, _, codes in jobs.runs()), result
