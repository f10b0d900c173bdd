"""Aim runs are closed with everything they tracked, on every ending: real aim, a repository
in the test's folder, in subprocesses (tests/scripts/tracker_job.py). The repository is read
back with aim's own reader, after `aim storage reindex` (a repository's index is built by
aim's UI, not by the runs). Baselines without the shim (reported, not gating) are those of
aim 3.29. The patch contract is in test_contract.py, the gate's in test_trackers.py."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("aim")

from helpers import ROOT, ended_quietly, python, tracker_job  # noqa: E402

STEPS = list(range(8))  # what tracker_job.py logs
ENDINGS = {"normal": (0, 0), "exit3": (3, 0), "raise": (1, 1), "interrupt": (-2, 1), "sigterm": (-15, 0)}
CLOSED = ("closed", STEPS)  # what each run must be
READ = """
import json, os, sys
from aim import Repo
from aim.storage.context import Context
repo = Repo.from_path(sys.argv[1])
active = set(repo.list_active_runs())  # what aim's UI shows as active: the progress flags left
found = []
for run in repo.iter_runs():
    metric = run.get_metric(sys.argv[2], Context({}))
    values = metric.values.sparse_numpy()[1] if metric else []  # keyed by a hash of the step
    locked = os.path.exists(os.path.join(sys.argv[1], ".aim", "locks", run.hash + ".softlock"))
    in_progress = run.active or run.end_time is None or locked or run.hash in active
    found.append(["in progress" if in_progress else "closed", sorted(map(float, values))])
print(json.dumps(sorted(found)))
"""


def job(jobs, what, ending, **kwargs):
    return tracker_job(jobs, "aim", what, ending, **kwargs)


def tracked(folder, metric):
    """(state, the metric's values, sorted) of each run in the repository at `folder`: "closed"
    (an end time, not active, no lock left, not listed by `Repo.list_active_runs()`) or "in progress"."""
    if not (folder / ".aim").exists():
        return []
    aim = Path(sys.executable).parent / "aim"
    reindex = python([str(aim), "storage", "--repo", str(folder), "reindex", "-y"], shim=False, timeout=120)
    assert reindex.returncode == 0, reindex
    result = python(READ, folder, metric, shim=False, timeout=120)
    assert result.returncode == 0, result
    return [tuple(run) for run in json.loads(result.stdout)]


def runs(folder):
    """(state, tracked steps) of each run tracker_job.py made (it tracks 1 / (step + 1))."""
    return sorted((state, sorted(round(1 / value) - 1 for value in values))
                  for state, values in tracked(folder, "loss"))


read, WHOLE = runs, [CLOSED]  # for test_trackers.py


def check(jobs, result, status, expected, traces=0):
    ended_quietly(result, status, traces)
    assert runs(jobs.dir) == expected, result


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_run_is_closed_with_its_steps(jobs, ending):
    status, traces = ENDINGS[ending]
    check(jobs, job(jobs, "one", ending), status, [CLOSED], traces)


@pytest.mark.baseline
def test_without_the_shim_a_sigterm_leaves_the_run_in_progress_and_locked(jobs):
    job(jobs, "one", "sigterm", shim=False)
    assert runs(jobs.dir) == [("in progress", STEPS)]


def test_a_run_started_before_autoteardown_was_imported(jobs):
    check(jobs, job(jobs, "late_import", "sigterm", shim=False, PYTHONPATH=ROOT), -15, [CLOSED])


def test_a_run_the_user_closed_is_left_alone(jobs):
    check(jobs, job(jobs, "finished", "sigterm"), -15, [CLOSED])


def test_a_tracker_that_closes_in_del(jobs):
    check(jobs, job(jobs, "tracker", "sigterm"), -15, [CLOSED])


@pytest.mark.needs_torch
def test_a_run_in_a_ray_actor_is_closed_when_the_driver_ends(jobs):
    pytest.importorskip("ray")
    result = job(jobs, "ray", "normal", timeout=180)
    assert result.returncode == 0, result
    assert runs(jobs.dir) == [CLOSED], result


@pytest.mark.needs_torch
@pytest.mark.baseline
def test_a_run_in_a_ray_actor_without_the_shim(jobs):
    pytest.importorskip("ray")
    result = job(jobs, "ray", "normal", shim=False, timeout=180)
    assert runs(jobs.dir) != [CLOSED], result
