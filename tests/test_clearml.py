"""ClearML tasks end with their true state and every scalar, on every ending, and a SIGTERM
ends the job: the real clearml client in subprocesses (tests/scripts/tracker_job.py, as
verl's ClearMLLogger) against a stand-in for ClearML's API (tests/clearml_server.py, its own
process), whose records are the task's state on the server (tasks.completed / failed /
stopped) and the scalars it received (events.add_batch). Baselines without the shim (reported,
not gating) are those of clearml 2.1.12: for every ending but SIGTERM they are the reference
the shim keeps (it leaves those to clearml's own exit hook). The patch contract is in
test_contract.py, the gate's in test_trackers.py."""

import signal
import subprocess
import time

import psutil
import pytest

pytest.importorskip("clearml")

from clearml_server import Server  # noqa: E402

from helpers import (  # noqa: E402
    LOAD_MARGIN,
    ROOT,
    ended_quietly,
    scancel,
    tracker_job,
    wait_for_line,
    wait_gone,
    wait_session_gone,
)

# AUTOTEARDOWN_TIMEOUT here. After a SIGTERM the task needs one write of clearml's reporting
# subprocess (every 5 s), and the teardown may begin as late as half the deadline (signals.py's
# rule 4: an unwind lost, under load): twice the 5 s and a margin, so every path fits.
TIMEOUT = 12.0
STEPS = list(range(8))  # what tracker_job.py logs
ENDINGS = {"normal": (0, 0), "exit3": (3, 0), "raise": (1, 1), "interrupt": (-2, 1), "sigterm": (-15, 0)}
STATES = {"normal": "completed", "exit3": "failed", "raise": "failed", "interrupt": "stopped", "sigterm": "stopped"}
ENDS = ("tasks.started", "tasks.completed", "tasks.failed", "tasks.stopped", "tasks.close")


@pytest.fixture
def server(jobs):
    stand_in = Server(jobs.dir, jobs)
    try:
        yield stand_in
    finally:
        stand_in.stop()


def job(jobs, server, what, ending, sdk="", **kwargs):
    return tracker_job(jobs, "clearml", what, ending, **server.env(sdk), **{"AUTOTEARDOWN_TIMEOUT": TIMEOUT, **kwargs})


def states(calls):
    """The state changes the server received, in order: ["started", "stopped"]."""
    return [c["endpoint"].split(".")[1] for c in calls if c["endpoint"] in ENDS]


def scalars(calls):
    """The iterations of the `loss` scalars the server received, sorted."""
    return sorted(e["iter"] for c in calls if c["endpoint"] == "events.add_batch" for e in c["body"]["events"]
                  if e.get("type") == "training_stats_scalar" and e.get("metric") == "loss")


def read(folder):
    """(states, scalars) as the stand-in recorded them in folder (for test_trackers.py)."""
    calls = Server.read(folder)
    return states(calls), scalars(calls)


WHOLE = (["started", "failed"], STEPS)  # test_trackers.py's ending, exit3, as clearml alone leaves it


def job_env(jobs):
    """For test_trackers.py: a stand-in in jobs.dir (killed by pid with the jobs' sessions), and
    the environment that points the client at it."""
    return Server(jobs.dir, jobs).env()


def check(server, result, status, state, traces=0, steps=STEPS):
    ended_quietly(result, status, traces)
    calls = server.calls()
    assert (states(calls), scalars(calls)) == (["started", state], steps), result
    assert wait_session_gone(result.pid, LOAD_MARGIN) == [], result  # clearml's reporting subprocess too


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_ending_gives_the_task_its_true_state_and_every_scalar(jobs, server, ending):
    status, traces = ENDINGS[ending]
    result = job(jobs, server, "one", ending)
    check(server, result, status, STATES[ending], traces)
    if ending == "sigterm":  # clearml's handler swallows it: ours ends the job within the deadline
        assert result.elapsed < TIMEOUT + LOAD_MARGIN, result


@pytest.mark.baseline
@pytest.mark.parametrize("ending", [e for e in ENDINGS if e != "sigterm"])
def test_without_the_shim_clearml_alone_gives_the_same_state(jobs, server, ending):
    """The reference the shim keeps: clearml's own exit hook ends the task (not a symptom)."""
    status, traces = ENDINGS[ending]
    check(server, job(jobs, server, "one", ending, shim=False), status, STATES[ending], traces)


@pytest.mark.baseline
def test_without_the_shim_clearml_swallows_sigterm(jobs, server):
    env = {"TRACKER_DIR": jobs.dir, **server.env()}
    proc = jobs.start("tracker_job.py", "clearml", "one", "sigterm", shim=False, env=env)
    wait_for_line(proc, "READY")
    proc.send_signal(signal.SIGTERM)
    with pytest.raises(Exception, match="timed out"):  # still running at the shim's bound
        proc.wait(timeout=TIMEOUT + LOAD_MARGIN)
    assert states(server.calls()) == ["started"]  # the task stays "running" on the server


def test_a_task_started_before_autoteardown_was_imported(jobs, server):
    result = job(jobs, server, "late_import", "sigterm", shim=False, PYTHONPATH=ROOT)
    check(server, result, -15, "stopped")


def test_a_task_the_user_closed_is_left_alone(jobs, server):
    check(server, job(jobs, server, "finished", "sigterm"), -15, "completed")


def test_a_tracker_that_ends_in_del(jobs, server):
    check(server, job(jobs, server, "tracker", "sigterm"), -15, "stopped")


@pytest.mark.parametrize("ending", ["normal", "sigterm"])
def test_with_a_reporting_thread(jobs, server, ending):
    """`report_use_subprocess: false`: clearml reports from a thread of the job's own."""
    status, traces = ENDINGS[ending]
    result = job(jobs, server, "one", ending, sdk="development.report_use_subprocess: false")
    check(server, result, status, STATES[ending], traces)


def test_a_fork_child_leaves_the_task_to_its_parent(jobs, server):
    check(server, job(jobs, server, "fork", "exit3"), 3, "failed", steps=STEPS + [s + len(STEPS) for s in STEPS])


@pytest.mark.needs_torch
def test_a_task_in_a_ray_actor_ends_when_the_driver_ends(jobs, server):
    """verl's TaskRunner owns the task. Ray SIGTERMs the actor: clearml's own handler (over Ray's
    and ours) ends the task "stopped", and waits for its reporting subprocess's last write (up to
    5 s): within a grace of 10 s every scalar arrives (Ray's 5 s default cuts it short)."""
    pytest.importorskip("ray")
    result = job(jobs, server, "ray", "normal", timeout=180, AUTOTEARDOWN_RAY_GRACE_S=10)
    assert result.returncode == 0, result
    calls = server.calls()
    assert (states(calls), scalars(calls)) == (["started", "stopped"], STEPS), result


@pytest.mark.needs_torch
@pytest.mark.baseline
def test_a_task_in_a_ray_actor_without_the_shim(jobs, server):
    pytest.importorskip("ray")
    result = job(jobs, server, "ray", "normal", shim=False, timeout=180)
    calls = server.calls()
    assert states(calls) == ["started"] and scalars(calls) == [], result  # "running", nothing reported


@pytest.mark.needs_torch
def test_a_sigterm_after_clearml_took_it_from_our_handler(jobs, server):
    """The DataLoader's workers armed the teardown before Task.init: clearml's handler replaced
    ours, and ours goes back."""
    pytest.importorskip("torchdata")
    result = job(jobs, server, "loader", "sigterm")
    check(server, result, -15, "stopped")
    assert result.elapsed < TIMEOUT + LOAD_MARGIN, result


def stopped(jobs, server, stop, shim=True):
    """tracker_job.py's task, stopped once READY by `stop`(proc) (a SLURM stop, a SIGKILL): (the
    Run, or None if it runs on past the deadline; the seconds it took; the pids of its reporting
    subprocess, a fork: the children running the script's command line, not a `git` of clearml's)."""
    proc = jobs.start("tracker_job.py", "clearml", "one", "sigterm", shim=shim,
                      env={"TRACKER_DIR": jobs.dir, "AUTOTEARDOWN_TIMEOUT": TIMEOUT, **server.env()})
    _, before = wait_for_line(proc, "READY")
    main = psutil.Process(proc.pid)
    reporter = []
    for child in main.children():
        try:
            reporter += [child.pid] if child.cmdline() == main.cmdline() else []
        except psutil.Error:  # a `git` that ended, not reaped yet
            pass
    sent = time.monotonic()
    stop(proc)
    try:
        proc.wait(TIMEOUT + LOAD_MARGIN)
    except subprocess.TimeoutExpired:
        return None, None, reporter
    return jobs.finish(proc, before=before), time.monotonic() - sent, reporter


def test_every_process_signalled_at_once_keeps_the_task_and_its_scalars(jobs, server):
    # SLURM's stop: the reporting subprocess gets SIGTERM with the script. It ignores it (else it
    # dies with the scalars it holds, and the lock the teardown then waits on): stopped, 8 of 8.
    result, took, reporter = stopped(jobs, server, lambda proc: scancel(proc.pid))
    assert result is not None and len(reporter) == 1, reporter
    check(server, result, -15, "stopped")
    assert took < TIMEOUT + LOAD_MARGIN, result


@pytest.mark.baseline
def test_without_the_shim_every_process_signalled_runs_on_and_loses_the_scalars(jobs, server):
    result, _, _ = stopped(jobs, server, lambda proc: scancel(proc.pid), shim=False)
    assert result is None and scalars(server.calls()) == [], result


def test_a_killed_script_leaves_no_reporting_process(jobs, server):
    # The OOM killer, a SIGKILL: no teardown; clearml's reporting subprocess leaves once it sees its
    # parent gone, ignoring SIGTERM or not.
    result, _, reporter = stopped(jobs, server, lambda proc: proc.kill())
    assert result is not None and result.returncode == -9 and len(reporter) == 1, reporter
    assert wait_gone(reporter, within=30 + LOAD_MARGIN) == [], reporter
