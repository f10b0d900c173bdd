"""Ray with the shim is never worse than without it: the same script, with and without the
shim, ends with the same status and results, in no more time than its bounds allow, and leaves
nothing behind."""

import re
import signal
import threading
import time
import uuid

import psutil
import pytest

from helpers import LOAD_MARGIN, python, reported, wait_for_line, wait_gone, wait_until_empty

pytest.importorskip("ray")


@pytest.mark.needs_torch
@pytest.mark.parametrize("shim", [True, False])
def test_a_fork_child_of_an_actor_starts_processes_as_without_the_shim(jobs, shim):
    # The DataLoader's fork workers start a process each item before the actor has started
    # one: a fork child that talked to GCS through its parent's client would wait forever.
    timeout = 60
    result = jobs.run("ray_nw_fork_child.py", shim=shim, env={"ITEMS": 20, "TIMEOUT_S": timeout}, timeout=180)
    assert result.returncode == 0, result
    items, took = result.stdout.split("ITEMS:")[1].split()[:2]
    assert int(items) == 20, result
    assert float(took) <= LOAD_MARGIN < timeout, result
    assert wait_gone(reported(result.stdout, "PIDS"), within=LOAD_MARGIN) == [], result


def guards(run_id):
    """The pids of this run's guard processes (ray_guard.py: MARKER=guard in their environment)."""
    found = []
    for process in psutil.process_iter():
        try:
            env = process.environ()
            if env.get("AUTOTEARDOWN_INTERNAL_RAY_ACTOR") == "guard" and env.get("NW_RUN") == run_id:
                found.append(process.pid)
        except psutil.Error:
            pass
    return found


def test_an_actor_ending_actors_leaves_one_guard_that_ends_their_processes(jobs):
    # A controller actor ray.kills 20 busy actors back to back, each with a process that ignores
    # SIGTERM and is no child of the actor's (Ray's own cleanup misses it): one guard process on
    # the node (30 MB at most) watches every one, and it ends each actor's process at the grace,
    # then exits once they are gone.
    grace, run_id = 2.0, uuid.uuid4().hex
    result = jobs.run("ray_nw_kill_many.py", env={"N": 20, "CHILD": 1, "LEARN_S": 2, "NW_RUN": run_id,
                                                  "AUTOTEARDOWN_RAY_GRACE_S": grace}, timeout=300)
    jobs.track(guards(run_id))
    assert result.returncode == 0, result
    count, rss = result.stdout.split("GUARDS:")[1].split()[:2]
    assert int(count) == 1 and float(rss) <= 30, result
    children = reported(result.stdout, "CHILDREN")
    assert len(children) == 20, result
    assert wait_gone(children, within=grace + LOAD_MARGIN) == [], result
    assert wait_until_empty(lambda: guards(run_id), within=LOAD_MARGIN) == [], result


@pytest.mark.parametrize("ending", ["end", "stopped"])
def test_a_job_on_a_shared_cluster_leaves_nothing(jobs, ending):
    # A shared cluster outlives its jobs: an actor's key (ray_worker.ARMED) goes when the actor
    # ends (ray.kill, __ray_terminate__), and the rest of the job's at the driver's end, a stopped
    # driver's (SIGTERM) too; after the job, none of its actors is alive, and none of its
    # processes (the actors', what they started, the node's guard) runs.
    from test_ray_cluster import RAY, ray_start

    run_id = uuid.uuid4().hex
    with ray_start(RAY) as address:
        env = {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled", "NW_RUN": run_id,
               "RAY_RUNTIME_ENV_HOOK": "autoteardown.ray_runtime_env_hook"}  # the cluster's workers get the shim
        if ending == "end":
            result = jobs.run("ray_nw_keys.py", env=env, timeout=180)
            assert result.returncode == 0, result
        else:
            proc = jobs.start("ray_nw_keys.py", "stopped", env=env)
            _, before = wait_for_line(proc, "READY", timeout=180)
            proc.send_signal(signal.SIGTERM)
            result = jobs.finish(proc, timeout=120, before=before)
        assert reported(result.stdout, "KEYS_MADE") == [3], result  # each actor said it started a process
        assert reported(result.stdout, "ENDED_LEFT") == [0], result  # gone as they ended, while the driver runs
        (job,) = re.findall(r"^JOB: (\w+)", result.stdout, re.M)
        listed = python("import ray; ray.init(); "
                        "print('KEYS:', len(ray._private.worker.global_worker.gcs_client.internal_kv_keys("
                        "b'', b'autoteardown-armed', timeout=10))); "
                        f"print('ALIVE:', sum(a['JobID'] == {job!r} and a['State'] != 'DEAD' "
                        "for a in ray._private.state.actors().values()))", shim=False, env=env, timeout=120)
        assert listed.returncode == 0, listed
        assert reported(listed.stdout, "KEYS") == [0], (listed.stdout, listed.stderr[-2000:], result)
        assert reported(listed.stdout, "ALIVE") == [0], (listed.stdout, listed.stderr[-2000:], result)
        processes = reported(result.stdout, "PIDS") + reported(result.stdout, "CHILDREN")
        assert len(processes) == 6, result
        assert wait_gone(processes, within=LOAD_MARGIN) == [], result
        assert wait_until_empty(lambda: guards(run_id), within=LOAD_MARGIN) == [], result


def test_an_actor_ending_actors_waits_for_no_gcs(monkeypatch):
    # In an actor, __ray_terminate__ and ray.kill hand nothing on (the ended actor's guard ends
    # it): with a GCS that does not answer (any lookup never returns: a fault made by hand), no
    # call waits for it.
    from types import SimpleNamespace

    from autoteardown.integrations import ray_driver, ray_worker

    answered = threading.Event()
    monkeypatch.setattr(ray_worker, "in_actor", lambda: True)
    monkeypatch.setattr(ray_driver, "_unarm", lambda actor_id: None, raising=False)  # no GCS in this process
    monkeypatch.setattr(ray_driver._Ending, "locate", lambda ending: answered.wait(60) and ending.finish())
    took = []
    try:
        for n in range(3):
            handle = SimpleNamespace(_ray_actor_id=SimpleNamespace(hex=lambda n=n: f"{n + 1:02x}" * 16))
            began = time.monotonic()
            ray_driver._watch_ending(handle, time.time())
            took.append(time.monotonic() - began)
    finally:
        answered.set()
    assert sum(took) < 0.5, took
