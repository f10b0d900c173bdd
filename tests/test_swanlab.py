"""SwanLab runs keep every logged step and end with the state the process really ends
with: real swanlab, offline, in subprocesses (tests/scripts/tracker_job.py); the run
file is read back with swanlab's own DataStoreReader. Baselines without the shim
(reported, not gating) are those of swanlab 0.10.3. The patch contract is in
test_contract.py, the gate's in test_trackers.py."""

import pytest

pytest.importorskip("swanlab")

from helpers import ROOT, ended_quietly, tracker_job  # noqa: E402

STEPS = list(range(8))  # what tracker_job.py logs
ENDINGS = {  # ending: (process status, swanlab's state, tracebacks printed)
    "normal": (0, "FINISHED", 0),
    "exit3": (3, "CRASHED", 0),
    "raise": (1, "CRASHED", 1),
    "interrupt": (-2, "ABORTED", 1),
    "sigterm": (-15, "ABORTED", 0),
}


def job(jobs, what, ending, **kwargs):
    return tracker_job(jobs, "swanlab", what, ending, **kwargs)


def runs(folder):
    """(scalar steps, final state or None) of each run file under folder, or "empty"."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.proto.swanlab.run.v1.run_pb2 import RunState
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    found = []
    for path in sorted(folder.rglob("run-*.swanlab")):
        if path.stat().st_size == 0:
            found.append("empty")
            continue
        reader = DataStoreReader()
        reader.open(path)
        steps, state = [], None
        for data in reader:
            record = Record.FromString(data)
            if record.HasField("scalar"):
                steps.append(record.scalar.step)
            if record.HasField("finish"):
                state = RunState.Name(record.finish.state).removeprefix("RUN_STATE_")
        reader.close()
        found.append((steps, state))
    return found


read, WHOLE = runs, [(STEPS, "FINISHED")]  # for test_trackers.py


def check(jobs, result, status, expected, traces=0):
    ended_quietly(result, status, traces)
    assert runs(jobs.dir) == expected, result


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_step_and_the_true_state(jobs, ending):
    status, state, traces = ENDINGS[ending]
    check(jobs, job(jobs, "one", ending), status, [(STEPS, state)], traces)


@pytest.mark.baseline
@pytest.mark.parametrize("ending, expected", [("sigterm", ["empty"]), ("exit3", [(STEPS, "FINISHED")])])
def test_without_the_shim(jobs, ending, expected):
    result = job(jobs, "one", ending, shim=False)
    assert runs(jobs.dir) == expected, result


def test_with_dataloader_workers_sigterm(jobs):
    check(jobs, job(jobs, "loader", "sigterm"), -15, [(STEPS, "ABORTED")])


def test_a_run_started_before_autoteardown_was_imported(jobs):
    check(jobs, job(jobs, "late_import", "sigterm", shim=False, PYTHONPATH=ROOT), -15, [(STEPS, "ABORTED")])


def test_a_run_the_user_finished_is_left_alone(jobs):
    check(jobs, job(jobs, "finished", "exit3"), 3, [(STEPS, "FINISHED")])


def test_a_tracker_that_finishes_in_del(jobs):
    check(jobs, job(jobs, "tracker", "sigterm"), -15, [(STEPS, "ABORTED")])


def test_a_fork_child_leaves_the_run_to_its_parent(jobs):
    check(jobs, job(jobs, "fork", "exit3"), 3, [(STEPS + [s + len(STEPS) for s in STEPS], "CRASHED")])


@pytest.mark.needs_torch
def test_a_run_in_a_ray_actor_ends_when_the_driver_ends(jobs):
    pytest.importorskip("ray")
    result = job(jobs, "ray", "normal", timeout=180)
    assert result.returncode == 0, result
    assert runs(jobs.dir) == [(STEPS, "FINISHED")], result


@pytest.mark.needs_torch
@pytest.mark.baseline
def test_a_run_in_a_ray_actor_without_the_shim(jobs):
    pytest.importorskip("ray")
    result = job(jobs, "ray", "normal", shim=False, timeout=180)
    assert runs(jobs.dir) == ["empty"], result
