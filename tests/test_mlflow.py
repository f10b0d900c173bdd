"""MLflow runs end with the status the process really had, on every ending, in bounded time.

Real mlflow: a sqlite store (sqlite:///<tmp>/mlruns.db) and a real `mlflow server` on
127.0.0.1 (one per module; the server-gone tests start their own), statuses and metrics
read back with MlflowClient. Each script ending is a subprocess (tests/scripts/mlflow_job.py).
"""

import re
import signal

import pytest

import mlflow_server
from helpers import (
    LOAD_MARGIN,
    Jobs,
    free_port,
    noise,
    python,
    reported,
    tracebacks,
    wait_for_line,
)
from mlflow_server import ENV, Server, sqlite_store

pytest.importorskip("mlflow")

# The read-back MlflowClient in this process: sqlalchemy deprecation noise from mlflow's store.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

METRICS = 10
TIMEOUT = 3.0  # AUTOTEARDOWN_TIMEOUT of the server-gone tests

# (what, ending): the status mlflow alone records (measured, 3.17), and the right one.
ROWS = {
    ("one", "normal"): ("FINISHED", "FINISHED"),
    ("one", "raise"): ("FINISHED", "FAILED"),
    ("one", "exit3"): ("FINISHED", "FAILED"),
    ("one", "interrupt"): ("FINISHED", "KILLED"),
    ("one", "sigterm"): ("RUNNING", "KILLED"),
    ("thread", "normal"): ("RUNNING", "FINISHED"),
    ("tracker", "raise"): ("FINISHED", "FAILED"),
    ("tracker", "sigterm"): ("RUNNING", "KILLED"),
}
# Python dies of SIGINT after an uncaught KeyboardInterrupt only while SIGINT's handler is
# its own: with mlflow 2.10 and a sqlite store it is not by then, and the script exits 1,
# with or without the shim.
RETURNCODES = {"normal": {0}, "raise": {1}, "exit3": {3}, "interrupt": {-signal.SIGINT, 1},
               "sigterm": {-signal.SIGTERM}}
TRACEBACKS = {"raise": 1, "interrupt": 1}


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    # mlflow 2.10's sqlite store makes its default artifact root, ./mlruns, where it runs:
    # here and in the scripts (they inherit the working directory).
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module", autouse=True)
def migrated_store(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    template = tmp_path_factory.mktemp("mlflow-template") / "mlruns.db"
    MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()
    mlflow_server.TEMPLATE[:] = [template]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    jobs = Jobs()  # the module's: the `jobs` fixture is one test's
    try:
        server = Server(tmp_path_factory.mktemp("mlflow-server"), jobs)
        yield server
        server.stop()
    finally:
        jobs.cleanup()


@pytest.fixture
def doomed_server(tmp_path, jobs):
    server = Server(tmp_path, jobs)
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "server"])
def store(request, tmp_path):
    if request.param == "sqlite":
        return sqlite_store(tmp_path)
    return request.getfixturevalue("server").uri


# ---- running the scripts -----------------------------------------------------

def job(jobs, what, ending, uri, shim=True, timeout=120, **env):
    env = {**ENV, "MLFLOW_TRACKING_URI": uri, **env}
    if ending != "sigterm":
        return jobs.run("mlflow_job.py", what, ending, shim=shim, env=env, timeout=timeout)
    proc = jobs.start("mlflow_job.py", what, ending, shim=shim, env=env)
    _, before = wait_for_line(proc, "READY")
    proc.send_signal(signal.SIGTERM)
    return jobs.finish(proc, timeout=30, before=before)


def run_ids(result):
    return re.findall(r"^RUN: (\w+)$", result.stdout, re.M)


def runs(uri, ids):
    """(status, metric values kept, end time recorded) of each run, read back from the store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = []
    for run_id in ids:
        info = client.get_run(run_id).info
        found.append((info.status, len(client.get_metric_history(run_id, "loss")), info.end_time is not None))
    return found


def ended(status):
    return (status, METRICS, status != "RUNNING")


# ---- every ending ----------------------------------------------------------------

@pytest.mark.parametrize("what, ending", list(ROWS))
def test_each_run_ends_with_the_right_status(jobs, store, what, ending):
    result = job(jobs, what, ending, store)
    assert result.returncode in RETURNCODES[ending], result
    ids = run_ids(result)
    assert len(ids) == 1, result
    assert runs(store, ids) == [ended(ROWS[what, ending][1])], result
    assert tracebacks(result.stderr) == TRACEBACKS.get(ending, 0), result
    assert noise(result.stderr) == [] and "autoteardown" not in result.stderr, result


@pytest.mark.baseline
@pytest.mark.parametrize("what, ending", [row for row, (alone, right) in ROWS.items() if alone != right])
def test_without_the_shim_mlflow_records(jobs, tmp_path, what, ending):
    uri = sqlite_store(tmp_path)
    result = job(jobs, what, ending, uri, shim=False)
    assert result.returncode in RETURNCODES[ending], result
    assert runs(uri, run_ids(result)) == [ended(ROWS[what, ending][0])], result


def test_nested_runs_end_innermost_first(jobs, tmp_path):
    uri = sqlite_store(tmp_path)
    result = job(jobs, "nested", "raise", uri)
    assert result.returncode == 1, result
    parent, child = run_ids(result)
    assert runs(uri, [parent, child]) == [ended("FAILED")] * 2, result
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(child).info.end_time <= client.get_run(parent).info.end_time


def test_runs_the_user_ended_keep_their_status(jobs, tmp_path):
    # One ended with end_run("FAILED"), one with MlflowClient().set_terminated(id, "KILLED")
    # and left on mlflow's stack, where mlflow's own atexit hook ends it again as FINISHED.
    uri = sqlite_store(tmp_path)
    result = job(jobs, "ended", "normal", uri)
    assert result.returncode == 0 and result.stderr.count("autoteardown") == 0, result
    assert runs(uri, run_ids(result)) == [ended("FAILED"), ended("KILLED")], result


@pytest.mark.baseline
def test_without_the_shim_mlflow_ends_a_terminated_run_again(jobs, tmp_path):
    uri = sqlite_store(tmp_path)
    result = job(jobs, "ended", "normal", uri, shim=False)
    assert runs(uri, run_ids(result)) == [ended("FAILED"), ended("FINISHED")], result


# ---- a tracking server that is gone or stopped ---------------------------------

def exit_after_server_goes(jobs, server, how, tmp_path, shim=True, timeout=60):
    go = tmp_path / "go"
    env = {**ENV, "MLFLOW_TRACKING_URI": server.uri, "MLFLOW_JOB_GO": go}
    if shim:
        env["AUTOTEARDOWN_TIMEOUT"] = TIMEOUT
    proc = jobs.start("mlflow_job.py", "one", "gone", shim=shim, env=env)
    _, before = wait_for_line(proc, "READY")
    if how == "killed":
        server.stop()
    else:  # SIGSTOP: connections are accepted, never answered
        server.signal(signal.SIGSTOP)
    go.touch()
    return jobs.finish(proc, timeout=timeout, before=before)


def exit_time(result):
    return result.ended - float(re.search(r"^END: (\S+)$", result.stdout, re.M).group(1))


def check_left_running(result, db):
    [run_id] = run_ids(result)
    assert result.returncode == 0, result
    print(f"exit {exit_time(result):.2f} s after the server went (deadline {TIMEOUT} s)")
    # The goal: the deadline + 1 s (measured: see the README); plus the suite's load margin.
    assert exit_time(result) <= TIMEOUT + 1 + LOAD_MARGIN, result
    warnings = [line for line in result.stderr.splitlines() if "autoteardown" in line]
    assert len(warnings) == 1 and f"mlflow run {run_id} left RUNNING" in warnings[0], result
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result
    # The server's own store: every metric was logged, and the run could not be ended.
    assert runs(f"sqlite:///{db}", [run_id]) == [("RUNNING", METRICS, False)]


def test_a_server_gone_at_exit_holds_the_exit_no_longer_than_the_deadline(jobs, doomed_server, tmp_path):
    result = exit_after_server_goes(jobs, doomed_server, "killed", tmp_path)
    check_left_running(result, doomed_server.db)


def test_a_stopped_server_holds_the_exit_no_longer_than_the_deadline(jobs, server, tmp_path):
    try:
        result = exit_after_server_goes(jobs, server, "stopped", tmp_path)
    finally:
        server.signal(signal.SIGCONT)  # the module's server: the other tests go on using it
    check_left_running(result, server.db)


@pytest.mark.baseline
def test_without_the_shim_a_server_gone_at_exit_holds_the_exit_for_minutes(jobs, doomed_server, tmp_path):
    # mlflow's atexit end_run() retries for 255 s (measured, 3.17): we wait past the shim's bound.
    with pytest.raises(AssertionError, match="hung"):
        exit_after_server_goes(jobs, doomed_server, "killed", tmp_path, shim=False,
                               timeout=TIMEOUT + 2 + LOAD_MARGIN)


# ---- inside a Ray actor ---------------------------------------------------------------

def ray_job(jobs, tmp_path, shim):
    pytest.importorskip("ray")
    uri = sqlite_store(tmp_path)
    result = jobs.run("mlflow_ray.py", shim=shim, env={**ENV, "MLFLOW_TRACKING_URI": uri}, timeout=180)
    jobs.track(reported(result.stdout, "ACTOR"))
    assert result.returncode == 0, result
    return result, runs(uri, run_ids(result))


def test_a_run_in_a_ray_actor_ends_when_the_driver_exits(jobs, tmp_path):
    result, found = ray_job(jobs, tmp_path, shim=True)
    assert found == [ended("FINISHED")], result


@pytest.mark.baseline
def test_without_the_shim_a_run_in_a_ray_actor_stays_running(jobs, tmp_path):
    result, found = ray_job(jobs, tmp_path, shim=False)
    assert found == [ended("RUNNING")], result


# ---- the contract ----------------------------------------------------------------------

def test_can_be_disabled(jobs, tmp_path):
    uri = sqlite_store(tmp_path)
    result = job(jobs, "one", "raise", uri, AUTOTEARDOWN_DISABLED_INTEGRATIONS="mlflow")
    assert runs(uri, run_ids(result)) == [ended("FINISHED")], result  # mlflow's own hook


CONTRACT = """
import os, sys, threading, autoteardown
assert "mlflow" not in sys.modules and "autoteardown.integrations.mlflow" not in sys.modules

import mlflow
from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES
from autoteardown.integrations import mlflow as integration
from autoteardown.integrations import unsupported_reason
from autoteardown import integrations
original = mlflow.start_run.__wrapped__
integrations.instrument("mlflow")
assert mlflow.start_run.__wrapped__ is original  # wrapped once
assert mlflow.tracking.fluent.start_run is mlflow.start_run
assert integrations.get_version("mlflow") == mlflow.__version__ and unsupported_reason("mlflow") is None

mlflow.set_tracking_uri(sys.argv[1])
run = mlflow.start_run()
assert autoteardown.live() == {"mlflow": [run]}
autoteardown.finalize()
assert mlflow.active_run() is None and autoteardown.live() == {}
assert mlflow.get_run(run.info.run_id).info.status == "FINISHED"

# A server that is not there: one warning, and the user's own retry setting is untouched.
os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "4"
mlflow.set_tracking_uri(sys.argv[2])
run = mlflow.MlflowClient(sys.argv[1]).create_run("0")  # not recorded: the caller ends it
integration._stack().append(mlflow.tracking.fluent.ActiveRun(run))  # as start_run does
integration._record(mlflow.active_run(), integration._stack())
autoteardown.finalize(timeout=2)
assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 4
seen = []
thread = threading.Thread(target=lambda: seen.append(MLFLOW_HTTP_REQUEST_MAX_RETRIES.get()))
thread.start(); thread.join()
assert seen == [4] and mlflow.active_run() is None

integrations.uninstrument("mlflow")
assert mlflow.start_run is original and mlflow.tracking.fluent.start_run is original
assert "get" not in vars(MLFLOW_HTTP_REQUEST_MAX_RETRIES)
mlflow.set_tracking_uri(sys.argv[1])
mlflow.start_run()
assert autoteardown.live() == {}
mlflow.end_run()
print("OK")
"""


def test_contract_and_laziness(tmp_path):
    uri = sqlite_store(tmp_path)
    gone = f"http://127.0.0.1:{free_port()}"
    result = python(CONTRACT, uri, gone, env=ENV, timeout=120)
    assert result.returncode == 0 and result.stdout.endswith("OK\n"), result.stderr
    warnings = [line for line in result.stderr.splitlines() if "autoteardown" in line]
    assert len(warnings) == 1 and "left RUNNING" in warnings[0], result.stderr
