"""Trackio runs keep every logged step however the script ends: real trackio, local
(TRACKIO_DIR in the test's folder), in subprocesses (tests/scripts/tracker_job.py); the
steps are read from trackio's sqlite database. Trackio stores no end state, so the steps are
all there is to check, with the exit status and stderr. Baselines without the shim
(reported, not gating) are those of trackio 0.43.0. The patch contract is in
test_contract.py, the gate's in test_trackers.py."""

import sqlite3

import pytest

pytest.importorskip("trackio")

from helpers import ROOT, ended_quietly, tracker_job  # noqa: E402

STEPS = list(range(8))  # what tracker_job.py logs
ENDINGS = {"normal": (0, 0), "exit3": (3, 0), "raise": (1, 1), "interrupt": (-2, 1), "sigterm": (-15, 0)}
FINISHED = "* Run finished."  # what trackio's finish() prints


def job(jobs, what, ending, **kwargs):
    return tracker_job(jobs, "trackio", what, ending, **kwargs)


def steps(folder):
    """The steps of each run in the project's database, by run name."""
    found = {}
    for path in folder.glob("*.db"):
        with sqlite3.connect(path) as db:
            for run, step in db.execute("SELECT run_name, step FROM metrics ORDER BY id"):
                found.setdefault(run, []).append(step)
    return sorted(found.values())


read, WHOLE = steps, [STEPS]  # for test_trackers.py


def check(jobs, result, status, expected, traces=0):
    ended_quietly(result, status, traces)
    assert steps(jobs.dir) == expected, result


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_step_is_written(jobs, ending):
    status, traces = ENDINGS[ending]
    result = job(jobs, "one", ending)
    check(jobs, result, status, [STEPS], traces)
    assert result.stdout.count(FINISHED) == 1, result  # finished once, never twice


@pytest.mark.baseline
def test_without_the_shim_sigterm_loses_the_steps_still_queued(jobs):
    result = job(jobs, "one", "sigterm", shim=False)
    assert len(sum(steps(jobs.dir), [])) < len(STEPS), result


def test_with_dataloader_workers_sigterm(jobs):
    check(jobs, job(jobs, "loader", "sigterm"), -15, [STEPS])


def test_a_run_started_before_autoteardown_was_imported(jobs):
    check(jobs, job(jobs, "late_import", "sigterm", shim=False, PYTHONPATH=ROOT), -15, [STEPS])


def test_a_run_the_user_finished_is_left_alone(jobs):
    result = job(jobs, "finished", "sigterm")
    check(jobs, result, -15, [STEPS])
    assert result.stdout.count(FINISHED) == 1, result


def test_a_tracker_that_finishes_in_del(jobs):
    check(jobs, job(jobs, "tracker", "sigterm"), -15, [STEPS])


def test_a_fork_child_leaves_the_run_to_its_parent(jobs):
    result = job(jobs, "fork", "sigterm")
    check(jobs, result, -15, [STEPS + [s + len(STEPS) for s in STEPS]])
    assert result.stdout.count(FINISHED) == 1, result  # not in the child


@pytest.mark.needs_torch
def test_a_run_in_a_ray_actor_ends_when_the_driver_ends(jobs):
    pytest.importorskip("ray")
    result = job(jobs, "ray", "normal", timeout=180)
    assert result.returncode == 0, result
    assert steps(jobs.dir) == [STEPS], result
