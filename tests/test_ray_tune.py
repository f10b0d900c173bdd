"""Ray Tune: when an experiment is stopped, every trial's run ends with its steps and a true
state, and `fit()` does not wait out WandbLoggerCallback's upload timeout (ray_tune.py).

Each script starts its own local Ray and two trials logging through WandbLoggerCallback (wandb
offline, an upload timeout of 60 s) or MLflowLoggerCallback (sqlite); the driver is stopped once
both trials are at their sixth step. What each run must hold is what Tune recorded for its trial
(progress.csv)."""

import csv
import signal
import time

import pytest

from helpers import LOAD_MARGIN, noise, tracebacks, wait_for_line
from mlflow_server import Server

pytest.importorskip("ray.tune", exc_type=ImportError)
pytest.importorskip("ray.air.integrations.wandb", exc_type=ImportError)

TIMEOUT = 10.0  # AUTOTEARDOWN_TIMEOUT's default
UPLOAD_TIMEOUT = 60
STEPS = 40  # each trial's, in tune_job.py
STOPPED_STEPS = 400  # 40 s of steps: a stop at step 5 always finds the trial running


def stopped_experiment(jobs, signum, shim=True, tracker="wandb", **env):
    """Run tune_job.py, send `signum` (if any) once both trials are at step 5: (result, monotonic time sent).
    A stopped experiment's trials run STOPPED_STEPS, far longer than the wait for the stop, so that
    the stop finds both mid-trial: under load, a trial of STEPS can complete while the logging
    actors catch up, and its run then ends as Tune ends a finished trial's."""
    if signum:
        env.setdefault("TUNE_STEPS", STOPPED_STEPS)
    proc = jobs.start("tune_job.py", tracker, shim=shim, env={"TUNE_DIR": jobs.dir, "UPLOAD_TIMEOUT": UPLOAD_TIMEOUT, **env})
    _, before = wait_for_line(proc, "READY", timeout=120)
    until = time.monotonic() + 120
    while signum and not started(jobs, tracker) and time.monotonic() < until and proc.poll() is None:
        time.sleep(0.2)
    sent = time.monotonic()
    if signum:
        proc.send_signal(signum)
    return jobs.finish(proc, timeout=UPLOAD_TIMEOUT + 120, before=before), sent


def started(jobs, tracker):
    """Both trials are at step 5, and (wandb) both logging actors' runs hold a step: under load
    they lag behind the trials, and a run whose wandb.init is under way at the stop is lost with or
    without the shim."""
    if len(list(jobs.dir.glob("step5-*"))) < 2:
        return False
    try:
        return tracker != "wandb" or sum(bool(steps) for _, steps, _ in jobs.runs()) >= 2
    except Exception:  # a record being written
        return False


def mlflow_runs(jobs):
    """(status, how many `loss` values) of each trial's mlflow run, sorted."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{jobs.dir}/mlflow.db")
    experiment = client.get_experiment_by_name("autoteardown-tune")
    runs = client.search_runs([experiment.experiment_id])
    return sorted((run.info.status, len(client.get_metric_history(run.info.run_id, "loss"))) for run in runs)


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
    assert noise(result.stderr) == [] and "autoteardown:" not in result.stderr, result.stderr  # whole: the noise's source


def test_ctrl_c_ends_every_trials_mlflow_run_killed(jobs):
    pytest.importorskip("mlflow")
    result, _ = stopped_experiment(jobs, signal.SIGINT, tracker="mlflow")
    assert "FIT_RETURNED" in result.stdout, result
    iterations = tune_results(jobs)
    assert len(iterations) == 2 and all(iterations), result
    assert mlflow_runs(jobs) == sorted(("KILLED", len(steps)) for steps in iterations), result
    assert noise(result.stderr) == [] and "autoteardown:" not in result.stderr, result.stderr  # whole: the noise's source


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_experiment_archives_every_trials_comet_experiment(jobs, signum):
    """CometLoggerCallback's experiments live in the driver: comet's atexit callback archives them
    after a Ctrl-C, the comet integration after a SIGTERM. Each holds what Tune recorded."""
    pytest.importorskip("comet_ml")
    from test_comet import archives

    # No bound on time is tested here: the deadline holds Tune's unwind and comet's two ends with the
    # load margin, so that the exit, not a take-over at half the deadline, ends what Tune left.
    result, _ = stopped_experiment(jobs, signum, tracker="comet", AUTOTEARDOWN_TIMEOUT=TIMEOUT + 2 * LOAD_MARGIN)
    iterations = tune_results(jobs)
    found = sorted(archives(jobs.dir / "comet"))
    assert len(found) == 2 and all(found), result
    assert signum == signal.SIGTERM or found == iterations, result  # Tune writes no results at a SIGTERM


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_experiment_closes_every_trials_aim_run(jobs, signum):
    """AimLoggerCallback's runs live in the driver and Tune closes one only at its trial's end.
    aim's own atexit callback closes the others after a Ctrl-C, and after a SIGTERM when Ray's
    handler exits through sys.exit before its abort (both runs closed without the shim in the
    runs measured); the aim integration closes them at the driver's exit either way. Each
    holds a value for every result Tune recorded."""
    pytest.importorskip("aim")
    from test_aim import tracked

    result, _ = stopped_experiment(jobs, signum, tracker="aim")
    found = tracked(jobs.dir / "aim", "ray/tune/loss")
    iterations = tune_results(jobs)
    assert len(found) == 2 and all(values for _, values in found), result
    assert sorted(len(values) for _, values in found) == sorted(map(len, iterations)) or signum == signal.SIGTERM, result
    assert [state for state, _ in found] == ["closed"] * 2, result


def logged_six(client, run_id):
    keys = client.get_run(run_id).data.metrics
    return "loss" in keys and all(len(client.get_metric_history(run_id, key)) == 6 for key in keys)


def test_a_tracking_server_gone_holds_ctrl_c_no_longer_than_the_deadline(jobs):
    """The runs Tune left open are ended through the tracking server; when it is gone, mlflow's
    retries (minutes) must not hold fit(): they are bounded by AUTOTEARDOWN_TIMEOUT."""
    pytest.importorskip("mlflow")
    import mlflow

    server, deadline = Server(jobs.dir, jobs), 3.0
    proc = jobs.start("tune_job.py", "mlflow", env={
        "TUNE_DIR": jobs.dir, "MLFLOW_TRACKING_URI": server.uri, "TUNE_QUIET_AFTER": 6,
        "AUTOTEARDOWN_TIMEOUT": deadline, "MLFLOW_DISABLE_TELEMETRY": "true"})
    _, before = wait_for_line(proc, "READY", timeout=120)
    client, until = mlflow.MlflowClient(server.uri), time.monotonic() + 120
    # Both trials' six results are logged, every key of them: Tune logs a result one key at a
    # time, and a key still to log when the server goes is Tune's own call, retried for minutes.
    while time.monotonic() < until and proc.poll() is None:
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        if len(runs) == 2 and all(logged_six(client, run.info.run_id) for run in runs):
            break
        time.sleep(0.5)
    server.stop()
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    result = jobs.finish(proc, timeout=120, before=before)
    returned = float(result.stdout.split("FIT_RETURNED")[1].split()[0])
    print(f"fit() returned {returned - sent:.2f} s after Ctrl-C, the server gone (deadline {deadline} s)")
    assert returned - sent < deadline + 5 + LOAD_MARGIN, result
    assert result.returncode == 0 and tracebacks(result.stderr) == 0, result


def test_a_finished_experiment_keeps_tunes_own_ends(jobs):
    pytest.importorskip("mlflow")
    result, _ = stopped_experiment(jobs, None, tracker="mlflow")
    assert result.returncode == 0 and "FIT_RETURNED" in result.stdout, result
    assert mlflow_runs(jobs) == [("FINISHED", STEPS)] * 2, result


@pytest.mark.parametrize("tracker", ["wandb", "wandb-unwritten"])
def test_a_finished_experiment_keeps_every_wandb_run_whole(jobs, tracker):
    """Tune kills each logging actor, and Ray its wandb-core, as soon as the actor's run() returns:
    each run must be on disk by then. wandb-unwritten holds the run in wandb-core until wandb is
    torn down, so that kill loses it for certain."""
    result, _ = stopped_experiment(jobs, None, tracker=tracker)
    assert result.returncode == 0 and "FIT_RETURNED" in result.stdout, result
    runs = jobs.runs()
    assert [(steps, set(codes)) for _, steps, codes in runs] == [(list(range(1, STEPS + 1)), {0})] * 2, result


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
@pytest.mark.parametrize("ending", ["raise", "early"])
def test_a_trial_that_raises_or_is_stopped_early_keeps_its_run_as_tune_ended_it(jobs, tracker, ending):
    """Tune ends these runs itself (log_trial_end): nothing is lost without the shim either,
    and the shim changes nothing. Trial x=2 raises, or the scheduler stops it, after 8 results."""
    if tracker == "mlflow":
        pytest.importorskip("mlflow")
    result, _ = stopped_experiment(jobs, None, tracker=tracker, TUNE_ENDING=ending)
    assert result.returncode == 0 and "FIT_RETURNED" in result.stdout, result
    assert tune_results(jobs) == [list(range(1, 9)), list(range(1, STEPS + 1))], result
    if tracker == "wandb":  # Tune ends a failed trial's run with exit code 0 too
        runs = jobs.runs()
        assert sorted((steps, codes) for _, steps, codes in runs) == sorted(
            [(list(range(1, 9)), [0]), (list(range(1, STEPS + 1)), [0])]), result
    else:
        assert mlflow_runs(jobs) == sorted([("FAILED" if ending == "raise" else "FINISHED", 8),
                                            ("FINISHED", STEPS)]), result
    assert "autoteardown:" not in result.stderr, result


@pytest.mark.baseline
def test_without_the_shim_a_run_not_yet_written_is_lost_with_its_logging_actor(jobs):
    result, _ = stopped_experiment(jobs, None, shim=False, tracker="wandb-unwritten")
    assert result.returncode == 0 and "FIT_RETURNED" in result.stdout, result
    assert not any(codes for _, _, codes in jobs.runs()), result


def test_sigterm_ends_every_trials_run_with_143(jobs):
    result, _ = stopped_experiment(jobs, signal.SIGTERM)
    runs = [(steps, codes) for _, steps, codes in jobs.runs() if steps]
    assert len(runs) == 2 and all(codes == [143] for _, codes in runs), result
    # Only the runs that hold steps: Ray restarts Tune's logging actors (max_restarts=-1), and one
    # that opens a run while the stopped driver is ending them keeps nothing.


@pytest.mark.baseline
def test_without_the_shim_ctrl_c_leaves_mlflow_runs_running(jobs):
    pytest.importorskip("mlflow")
    stopped_experiment(jobs, signal.SIGINT, shim=False, tracker="mlflow")
    assert [status for status, _ in mlflow_runs(jobs)] == ["RUNNING"] * 2


@pytest.mark.baseline
def test_without_the_shim_ctrl_c_waits_out_the_upload_timeout_and_loses_the_runs(jobs):
    result, sent = stopped_experiment(jobs, signal.SIGINT, shim=False)
    returned = float(result.stdout.split("FIT_RETURNED")[1].split()[0])
    assert returned - sent >= UPLOAD_TIMEOUT, result
    assert all(codes == [] for _, _, codes in jobs.runs()), result
