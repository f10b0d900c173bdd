"""Ray: terminated actors really end; actors' resources are finalized in-band.

Each script starts its own local Ray (num_cpus=2, no dashboard) in a subprocess;
every actor pid a script reports is killed at the end of the test.
"""

import json
import re
import signal
import sys
import time

import pytest

import wandb_records
from helpers import LOAD_MARGIN, kill_pids, noise, run, wait_for_line, wait_gone

GRACE = 2.0  # AUTOTEARDOWN_RAY_GRACE_S for the hung-actor scripts (default 5: the bounds scale with it)
HUNG = {"AUTOTEARDOWN_RAY_GRACE_S": GRACE}


def reported(result, tag):
    match = re.search(rf"^{tag}:(.*)$", result.stdout, re.M)
    assert match, result
    return match.group(1).split()


@pytest.fixture
def cleanup():
    pids = []
    yield pids
    kill_pids(pids)


@pytest.mark.parametrize("workers, shim", [
    ("off", True),           # the driver's reaper alone
    ("runtime_env", False),  # the actors' own watchdog alone, shipped through the job runtime_env
])
def test_hung_actors_end_within_the_grace_period(workers, shim, cleanup):
    result = run("ray_hung_actors.py", workers, shim=shim, env=HUNG, timeout=120)
    cleanup += [int(p) for p in reported(result, "PIDS") + reported(result, "BYSTANDER")]
    assert result.returncode == 0, result
    assert reported(result, "ALIVE") == [], result
    assert float(reported(result, "GONE_AFTER")[0]) <= GRACE + 2 + LOAD_MARGIN / 2, result  # the tight figure: tests/benchmark_ray.py
    assert reported(result, "BYSTANDER_ALIVE") == ["True"], result  # only the intended pids


def test_gc_hang_actors_armed_only_through_the_runtime_env_are_gone_within_grace_plus_2s(cleanup):
    # gc disabled, a cycle whose __del__ hangs: only the watchdog armed before
    # gc.collect() ends the actor (the driver has no shim, so no reaper).
    result = run("ray_hung_actors.py", "runtime_env", shim=False, env={**HUNG, "HANG": "gc"}, timeout=120)
    cleanup += [int(p) for p in reported(result, "PIDS") + reported(result, "BYSTANDER")]
    assert result.returncode == 0, result
    assert reported(result, "ALIVE") == [], result
    assert float(reported(result, "GONE_AFTER")[0]) <= GRACE + 2 + LOAD_MARGIN / 2, result  # the tight figure: tests/benchmark_ray.py


def test_a_7s_finalizer_is_bounded_by_the_grace_with_a_warning_that_names_it(cleanup):
    # One budget: the actor's in-band teardown gets the grace the reaper allows
    # (minus a second), so the reaper never kills it half-way unannounced.
    result = run("ray_hung_actors.py", "inherit", shim=True, env={**HUNG, "HANG": "slow", "WATCH_S": GRACE + 4},
                 timeout=120)
    cleanup += [int(p) for p in reported(result, "PIDS") + reported(result, "BYSTANDER")]
    assert result.returncode == 0, result
    assert reported(result, "ALIVE") == [], result
    assert float(reported(result, "GONE_AFTER")[0]) <= GRACE + 1 + LOAD_MARGIN / 2, result  # the tight figure: tests/benchmark_ray.py
    assert re.search(r"slow_finalizer.*(still running|left behind|deadline)", result.stderr), result


def test_live_actors_finalize_in_parallel_at_driver_exit(tmp_path, cleanup):
    # Three actors whose teardown takes 3 s each: asked all at once, they finish
    # together (one after another, they would finish 3 s apart).
    result = run("ray_busy_actors.py", env={"OUT_DIR": tmp_path, "FINALIZE_S": 3}, timeout=120)
    pids = [int(p) for p in reported(result, "PIDS")]
    cleanup += pids
    assert result.returncode == 0, result
    done = {p.name: p.stat().st_mtime for p in tmp_path.iterdir()}
    assert sorted(done) == sorted(map(str, pids)), result
    assert max(done.values()) - min(done.values()) < 2.0, (done, result)


def test_at_driver_exit_only_the_actors_that_recorded_something_are_ended(tmp_path, cleanup):
    # An actor with nothing to tear down is left to Ray, as without the shim (the
    # driver's exit does not wait for it); the others are ended and waited for.
    report = tmp_path / "report.jsonl"
    result = run("ray_busy_actors.py", env={"OUT_DIR": tmp_path, "FINALIZE_S": 0.5, "IDLE": 2,
                                            "AUTOTEARDOWN_REPORT": report}, timeout=120)
    pids, idle = [int(p) for p in reported(result, "PIDS")], [int(p) for p in reported(result, "IDLE_PIDS")]
    cleanup += pids + idle
    assert result.returncode == 0, result
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "report.jsonl") == sorted(map(str, pids)), result
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    driver = [line for line in lines if line["argv"][0].endswith("ray_busy_actors.py")]
    assert [s["outcome"] for s in driver[0]["steps"] if s["kind"] == "ray" and s["resource"] == "(for all)"] == [
        "3 actor(s) ended, 2 with nothing recorded left to Ray"], lines
    assert wait_gone(idle, 30) == [], result  # Ray ends them with the job


@pytest.mark.baseline
def sigterm_in_a_finalizer(jobs, shim, how="each"):
    proc = jobs.start("ray_driver_lost_unwind.py", how, shim=shim, env={"AUTOTEARDOWN_TIMEOUT": LOST_UNWIND_TIMEOUT})
    _, before = wait_for_line(proc, "READY", timeout=120)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    return jobs.finish(proc, timeout=120, before=before), sent


LOST_UNWIND_TIMEOUT = 4.0


@pytest.mark.parametrize("how", ["each", "once"])
def test_a_driver_whose_sigterm_unwind_is_lost_still_ends_of_it(jobs, how):
    """Ray's handler unwinds a driver with sys.exit(15); raised inside a finalizer, Python drops
    it and the job runs on. Ray's own abort 3 s later would still end it; the shim defers that
    abort for its teardown, so it must see the end through: the signal sent again once the
    finalizer has dropped the unwind, and at half the deadline a teardown that dies of it."""
    result, sent = sigterm_in_a_finalizer(jobs, shim=True, how=how)
    assert "LOOP_ENDED" not in result.stdout and result.returncode in (15, -signal.SIGTERM), result
    assert result.ended - sent < LOST_UNWIND_TIMEOUT + 1 + LOAD_MARGIN, result
    assert [codes for _, _, codes in jobs.runs()] in ([[15]], [[143]]), result


@pytest.mark.baseline
def test_without_the_shim_a_driver_whose_sigterm_unwind_is_lost_dies_of_rays_abort(jobs):
    result, _ = sigterm_in_a_finalizer(jobs, shim=False)
    assert result.returncode == -signal.SIGABRT and "LOOP_ENDED" not in result.stdout, result


def actor_sigterm_in_a_finalizer(jobs, holds, shim=True, **env):
    """ray_actor_lost_unwind.py: (seconds from the SIGTERM until the actor's process ended, or None;
    the actor's own stderr)."""
    result = jobs.run("ray_actor_lost_unwind.py", holds, jobs.dir, shim=shim, env={**HUNG, **env}, timeout=180)
    jobs.track_reported(result.stdout)
    assert "ACTOR_STDERR" in result.stdout, result
    gone = reported(result, "GONE")[0]
    return (None if gone == "never" else float(gone)), result.stdout.split("ACTOR_STDERR")[1], result


@pytest.mark.parametrize("holds", ["wandb", "nothing"])
def test_an_actor_whose_sigterm_unwind_is_lost_still_ends_of_it(jobs, holds):
    """Ray's handler unwinds an actor with SystemExit; raised inside a finalizer, Python drops it
    ("Exception ignored in") and the actor runs on as if never signalled. With the shim it is raised
    again once the finalizer is left: the actor ends (with its run torn down) and prints nothing."""
    gone, actor_stderr, result = actor_sigterm_in_a_finalizer(jobs, holds)
    assert ":actor_name:Actor" in actor_stderr, result  # the actor's own log was read: no vacuous check below
    assert gone is not None and gone < GRACE + LOAD_MARGIN, result
    assert "Exception ignored" not in actor_stderr + result.stderr, result
    if holds == "wandb":
        assert [(steps, codes) for _, steps, codes in jobs.runs()] == [(list(range(5)), [143])], result


@pytest.mark.baseline
def test_without_the_shim_an_actor_whose_sigterm_unwind_is_lost_runs_on(jobs):
    gone, actor_stderr, result = actor_sigterm_in_a_finalizer(jobs, "nothing", shim=False, WATCH_S=10)
    assert gone is None and "Exception ignored" in actor_stderr, result


def test_hung_actors_stay_alive_without_the_shim(cleanup):
    # Alive twice as long as the shim's bound: the symptom shown.
    result = run("ray_hung_actors.py", "off", shim=False, env={"WATCH_S": 2 * (GRACE + 2)}, timeout=120)
    pids = reported(result, "PIDS")
    cleanup += [int(p) for p in pids + reported(result, "BYSTANDER")]
    assert sorted(reported(result, "ALIVE")) == sorted(pids), result


def test_the_reaper_never_kills_a_reused_pid(jobs):
    from autoteardown.integrations.ray_guard import same_worker

    before = time.time() - 1
    stranger = jobs.popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # Created after the terminate request: a reused pid, not the actor.
        assert same_worker(stranger.pid, not_after=before) is False
        # Old enough, but not a Ray worker.
        assert same_worker(stranger.pid, not_after=time.time() + 1) is False
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_runtime_env_hook_adds_the_shim_and_chains_what_was_there(monkeypatch):
    from autoteardown import ray_runtime_env_hook

    env = ray_runtime_env_hook(None)
    assert env["worker_process_setup_hook"] == "autoteardown.install"
    assert env["py_modules"][0].endswith("autoteardown")
    assert env["py_modules"][1].endswith("wrapt")  # a cluster's Python may not have it
    assert ray_runtime_env_hook(env) == env  # applying it twice changes nothing

    env = ray_runtime_env_hook({"worker_process_setup_hook": "mypkg.setup", "py_modules": ["/x/mypkg"],
                                "env_vars": {"A": "1"}})
    assert env["worker_process_setup_hook"] == "autoteardown.integrations.ray.setup_hook"
    assert env["env_vars"] == {"A": "1", "AUTOTEARDOWN_NEXT_SETUP_HOOK": "mypkg.setup"}
    assert env["py_modules"][0] == "/x/mypkg" and len(env["py_modules"]) == 3

    monkeypatch.setenv("AUTOTEARDOWN_NEXT_RUNTIME_ENV_HOOK", "test_ray.users_own_hook")
    env = ray_runtime_env_hook({"pip": ["x"]})
    assert env["env_vars"] == {"SEEN": "['pip']"} and env["pip"] == ["x"]
    assert env["worker_process_setup_hook"] == "autoteardown.install"


def users_own_hook(runtime_env):
    return dict(runtime_env, env_vars={"SEEN": str(sorted(runtime_env))})


SETUP_CALLS = []


def users_setup_hook():
    SETUP_CALLS.append(True)


def test_setup_hook_runs_the_hook_it_replaced(monkeypatch):
    # Ray 2.40 has no ray._common.utils: the loader falls back to ray._private.utils.
    from autoteardown.integrations.ray import setup_hook

    monkeypatch.setenv("AUTOTEARDOWN_NEXT_SETUP_HOOK", "test_ray.users_setup_hook")
    SETUP_CALLS.clear()
    setup_hook()
    assert SETUP_CALLS == [True]


def task_runner(mode, shim, tmp_path, cleanup):
    env = {"WANDB_DIR": tmp_path, "WANDB_CACHE_DIR": tmp_path / "cache"}
    result = run("ray_task_runner.py", mode, shim=shim, env=env, timeout=180)
    pids = [int(p) for p in reported(result, "ACTOR") + reported(result, "CHILDREN")]
    cleanup += pids
    assert result.returncode == 0, result
    files = wandb_records.run_files(tmp_path)
    assert len(files) == 1, result
    return result, pids, wandb_records.records(files[0])


@pytest.mark.needs_torch
@pytest.mark.parametrize("mode", ["end", "terminate", "sigterm"])
def test_task_runner_keeps_its_data_and_leaves_no_process(mode, tmp_path, cleanup):
    result, pids, records = task_runner(mode, True, tmp_path, cleanup)
    steps = int(reported(result, "STEPS")[0])
    assert wandb_records.history_steps(records) == list(range(steps)), result
    assert wandb_records.exit_codes(records) == [0], result
    assert wait_gone(pids, within=5.0) == [], result
    assert noise(result.stderr) == [], result
    if mode != "end":
        assert reported(result, "ACTOR_GONE") == ["True"], result


@pytest.mark.needs_torch
@pytest.mark.baseline
def test_task_runner_without_the_shim_keeps_no_records(tmp_path, cleanup):
    result, pids, records = task_runner("end", False, tmp_path, cleanup)
    assert wandb_records.history_steps(records) == [] and wandb_records.exit_codes(records) == [], result
