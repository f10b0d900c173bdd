"""Comet experiments keep everything they logged, on every ending: real comet_ml, an
OfflineExperiment in subprocesses (tests/scripts/tracker_job.py); the offline archive is
read back as `comet upload` reads it (experiment.json, messages.json). Baselines without the
shim (reported, not gating) are those of comet_ml 3.58. The patch contract is in
test_contract.py, the gate's in test_trackers.py."""

import json
import zipfile

import pytest

pytest.importorskip("comet_ml")

from helpers import ROOT, ended_quietly, tracker_job  # noqa: E402

STEPS = list(range(8))  # what tracker_job.py logs
ENDINGS = {"normal": (0, 0), "exit3": (3, 0), "raise": (1, 1), "interrupt": (-2, 1), "sigterm": (-15, 0)}


def job(jobs, what, ending, **kwargs):
    return tracker_job(jobs, "comet", what, ending, **kwargs)


def archives(folder):
    """The `loss` steps of each offline archive under folder, or "empty" (no experiment in it)."""
    found = []
    for path in sorted(folder.rglob("*.zip")):
        with zipfile.ZipFile(path) as archive:
            if "experiment.json" not in archive.namelist():
                found.append("empty")
                continue
            messages = [json.loads(line) for line in archive.read("messages.json").splitlines() if line.strip()]
        metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
        found.append([m["step"] for m in metrics if m["metricName"] == "loss"])
    return found


read, WHOLE = archives, [STEPS]  # for test_trackers.py


def check(jobs, result, status, expected, traces=0):
    ended_quietly(result, status, traces)
    assert archives(jobs.dir) == expected, result


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_step_is_archived(jobs, ending):
    status, traces = ENDINGS[ending]
    check(jobs, job(jobs, "one", ending), status, [STEPS], traces)


@pytest.mark.baseline
def test_without_the_shim_a_sigterm_leaves_an_empty_archive(jobs):
    job(jobs, "one", "sigterm", shim=False)
    assert archives(jobs.dir) in ([], ["empty"])


def test_an_end_under_way_when_the_teardown_takes_over_is_not_ended_again(jobs):
    """A SIGTERM unwinds the script into its `finally: exp.end()`, whose archive upload takes
    4.5 s; at half the deadline (3 s) the teardown takes over from a helper thread while that end
    still runs. It waits for it and finds the experiment ended: the archive keeps every step and
    comet prints no failure. A second end started meanwhile archives the removed data folder
    again: comet's "Failed to properly clean the experiment" here, an archive rewritten with
    experiment.json alone when it comes a moment earlier (Tune's driver, under load)."""
    result = job(jobs, "slow_end", "sigterm", AUTOTEARDOWN_TIMEOUT="6", SLOW_END="4.5")
    check(jobs, result, -15, [STEPS])
    assert "Failed to properly clean" not in result.stderr, result


def test_an_experiment_started_before_autoteardown_was_imported(jobs):
    check(jobs, job(jobs, "late_import", "sigterm", shim=False, PYTHONPATH=ROOT), -15, [STEPS])


def test_an_experiment_the_user_ended_is_left_alone(jobs):
    check(jobs, job(jobs, "finished", "sigterm"), -15, [STEPS])


def test_a_tracker_that_ends_in_del(jobs):
    check(jobs, job(jobs, "tracker", "sigterm"), -15, [STEPS])


def test_a_fork_child_leaves_the_experiment_to_its_parent(jobs):
    check(jobs, job(jobs, "fork", "exit3"), 3, [STEPS + [s + len(STEPS) for s in STEPS]])


@pytest.mark.needs_torch
def test_an_experiment_in_a_ray_actor_ends_when_the_driver_ends(jobs):
    pytest.importorskip("ray")
    result = job(jobs, "ray", "normal", timeout=180)
    assert result.returncode == 0, result
    assert archives(jobs.dir) == [STEPS], result


@pytest.mark.needs_torch
@pytest.mark.baseline
def test_an_experiment_in_a_ray_actor_without_the_shim(jobs):
    pytest.importorskip("ray")
    result = job(jobs, "ray", "normal", shim=False, timeout=180)
    assert archives(jobs.dir) in ([], ["empty"]), result
