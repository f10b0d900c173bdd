"""Ray jobs that are stopped from outside: `kill <driver pid>` (a launcher forwarding
Ctrl-C as SIGTERM) or SIGTERM to the job's process group. A verl-shaped driver waits
in `ray.get(runner.run.remote(config))` while a TaskRunner actor trains with a
StatefulDataLoader (2 workers) and a wandb run. The actor's run keeps every step the
driver saw logged and gets an exit record (143), and no process of the job is left.
A Ray worker's SIGTERM is not torn down inside Ray's signal handler."""

import datetime
import glob
import json
import os
import re
import signal

import pytest

from helpers import LOAD_MARGIN, alive, in_session, noise, read_until, wait_until_empty

pytestmark = pytest.mark.needs_torch
SIGTERM_CODE = 128 + signal.SIGTERM
REAPED = r"autoteardown: WARNING: \w+ \w+ \(pid \d+\) still running [\d.]+s after SIGTERM: killed\n"


def stopped_job(jobs, group, shim=True, after_step=10, tracker="wandb", env=None):
    """Start the job, SIGTERM the driver (or its process group) once the actor has logged
    `after_step`; the Run, the steps the driver saw, and what of the job is still running
    5 s (plus the load margin) after the driver ended."""
    proc = jobs.start("ray_stopped_job.py", 40, 0.2, tracker, shim=shim, env=env)
    before = read_until(proc, rf"STEP: {after_step}\b")
    (os.killpg if group else os.kill)(proc.pid, signal.SIGTERM)
    result = jobs.finish(proc, timeout=120, before=before)
    seen = [int(n) for n in re.findall(r"STEP: (\d+)", result.stdout)]
    assert seen and max(seen) >= after_step, result
    jobs_pids = [int(p) for tag in ("ACTOR", "CHILDREN") for p in re.findall(rf"{tag}: ([\d ]+)", result.stdout)
                 for p in p.split()]
    left = wait_until_empty(lambda: alive(jobs_pids) + in_session(proc.pid), within=5.0 + LOAD_MARGIN)
    return result, seen, left


def assert_kept(jobs, result, seen, left):
    runs = jobs.runs()
    assert len(runs) == 1, result
    _, steps, codes = runs[0]
    assert steps == list(range(len(steps))) and len(steps) > max(seen), (steps, seen, result)
    assert codes == [SIGTERM_CODE], result
    assert left == [], result
    assert noise(result.stderr) == [] and "autoteardown:" not in result.stderr, result
    assert result.returncode != 0, result  # Ray's status for a stopped driver (1, or its abort)


def test_a_stopped_driver_keeps_the_actors_run_and_leaves_nothing(jobs):
    assert_kept(jobs, *stopped_job(jobs, group=False))


def killed_by_ray_first(result, report):
    """Did Ray end the actor where no Python runs before our teardown could keep its run? A
    raylet stopped with the group ends its workers in one of two ways, and which comes first
    is Ray's shutdown order, with or without the shim:
    - Its SIGKILL to the actor's process group (Ray 2.60: once it has left GCS, at once when GCS
      is gone already, SIGTERM and SIGKILL together). Ray's unless it came after the driver's
      teardown began (seen: 10-15 ms after the signal; the driver's teardown 15 ms to 1 s after,
      its main thread in `ray.get`).
    - It exits with its dashboard agent ("fate shares"), and the actor's core worker quits on it
      (Ray 2.40, whose actors are in the job's group: the group's SIGTERM begins their teardown).
      Ray's while the actor's teardown had not ended (no report line of its own)."""
    found = {tag: re.search(rf"{tag}: (\S+)", result.stdout) for tag in ("LOGS", "ACTOR", "DRIVER")}
    if None in found.values():
        return False
    logs, actor, driver = (m.group(1) for m in found.values())
    lines = [json.loads(line) for line in open(report)] if os.path.exists(report) else []
    raylet = "".join(open(path, errors="replace").read() for path in glob.glob(f"{logs}/raylet.out"))  # or none
    kill = re.search(rf"^\[(\S+ \S+),(\d+) .*SIGKILL to pgid={actor}\b", raylet, re.M)
    if kill:
        killed = datetime.datetime.strptime(kill.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(kill.group(2)) / 1000
        return any(line["pid"] == int(driver) and killed < line["started"] for line in lines)
    return "fate shares with the agent" in raylet and not any(line["pid"] == int(actor) for line in lines)


def test_a_stopped_process_group_keeps_the_actors_run_and_leaves_nothing(jobs, tmp_path):
    report = tmp_path / "report.jsonl"
    result, seen, left = stopped_job(jobs, group=True, env={"AUTOTEARDOWN_REPORT": str(report)})
    assert left == [], result
    runs = jobs.runs()
    if (not runs or runs[0][2] == []) and killed_by_ray_first(result, report):
        pytest.xfail("Ray ended the actor where no Python runs before our teardown could (Ray's shutdown order)")
    # Its raylet gone, the actor's own exit (Ray's, after our teardown) can hang (seen on Ray 2.40):
    # the driver's reaper then kills it at the grace and says so in one line, which is not noise.
    result.stderr = re.sub(REAPED, "", result.stderr)
    assert_kept(jobs, result, seen, left)


def test_a_stopped_driver_ends_an_actors_mlflow_run_as_killed_with_its_metrics(jobs):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{jobs.dir}/mlruns.db"
    result, seen, left = stopped_job(jobs, group=False, tracker="mlflow",
                                     env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true"})
    (run_id,) = re.findall(r"RUN: (\w+)", result.stdout)
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).info.status == "KILLED", result
    assert len(client.get_metric_history(run_id, "loss")) > max(seen), result
    assert left == [], result


def test_a_stopped_driver_flushes_an_actors_tensorboard_writer(jobs):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result, seen, left = stopped_job(jobs, group=False, tracker="tensorboard", env={"TB_LOGDIR": jobs.dir / "tb"})
    events = EventAccumulator(str(jobs.dir / "tb"))
    events.Reload()
    assert len(events.Scalars("loss")) > max(seen), result
    assert left == [], result


@pytest.mark.parametrize("group", [False, True], ids=["driver", "group"])
@pytest.mark.parametrize("shim", [True, pytest.param(False, marks=pytest.mark.baseline)])
def test_a_stopped_job_lets_an_actors_checkpoint_in_flight_complete(jobs, tmp_path, shim, group):
    from test_checkpoint import loaded

    # The actor's save has the grace its driver gives it before the kill: sized for a loaded
    # machine (the default 5 s was cut short once in CI, two tests writing at once).
    report = tmp_path / "report.jsonl"
    result, _, left = stopped_job(jobs, group=group, shim=shim, after_step=1, tracker="checkpoint",
                                  env={"CKPT_DIR": jobs.dir, "SLOW_WRITE_S": 1, "AUTOTEARDOWN_REPORT": str(report),
                                       "AUTOTEARDOWN_RAY_GRACE_S": 20, "AUTOTEARDOWN_TIMEOUT": 20})
    assert left == [], result
    outcome = loaded(jobs)
    if shim and group and outcome != "equal" and killed_by_ray_first(result, report):
        pytest.xfail("Ray ended the actor where no Python runs before our teardown could (Ray's shutdown order)")
    assert (outcome == "equal") is shim, result  # the baseline: no .metadata


@pytest.mark.baseline
@pytest.mark.parametrize("group", [False, True], ids=["driver", "group"])
def test_a_stopped_job_without_the_shim_keeps_no_exit_record(jobs, group):
    result, seen, left = stopped_job(jobs, group, shim=False)
    runs = jobs.runs()
    codes = runs[0][2] if runs else []
    print(f"without the shim: status {result.returncode}, {len(runs[0][1]) if runs else 0} of "
          f"{max(seen) + 1} steps kept, exit records {codes}, {len(left)} process(es) left")
    assert codes == [], result


@pytest.mark.parametrize("mode", ["busy", "idle"])
def test_a_workers_sigterm_is_torn_down_outside_rays_signal_handler(jobs, mode):
    out = jobs.dir / "probe.json"
    result = jobs.run("ray_worker_sigterm.py", mode, out, timeout=120)
    assert "GONE: True" in result.stdout and (mode == "idle" or "WORKING: True" in result.stdout), result
    probe = json.loads(out.read_text())
    assert probe["thread"].startswith("autoteardown-step"), probe
    in_handler = [f for f in probe["main_stack"] if f.startswith(("sigterm_handler ", "_ask ", "_on_worker_sigterm "))]
    assert in_handler == [], probe
