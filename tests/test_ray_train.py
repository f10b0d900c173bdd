"""Ray Train: rank 0's wandb run keeps its steps and gets the training function's
exit status, and no Train worker, DataLoader worker or wandb-core is left.

Ray Train v2 (the default in ray 2.60) ends its workers with
`actor.shutdown.remote()`, a 5 s wait, then always `ray.kill`; the shim
finalizes each worker in-band inside `RayTrainWorker.shutdown`. Legacy v1
(RAY_TRAIN_V2_ENABLED=0) ends them with `__ray_terminate__`.
Each script starts its own local Ray (num_cpus=2) in a subprocess."""

import importlib.util
import json
import re
import signal
import time

import pytest

from helpers import wait_for_line, wait_gone

pytest.importorskip("ray.train.torch", exc_type=ImportError)
pytestmark = pytest.mark.needs_torch
# Ray Train v2 (ray.train.v2) ships from ray 2.4x on; older Rays run v1 whatever the variable says.
needs_v2 = pytest.mark.skipif(importlib.util.find_spec("ray.train.v2") is None, reason="no Ray Train v2 in this Ray")

STEPS = list(range(10))


def ranks(out_dir):
    found = {}
    for path in sorted(out_dir.glob("rank*")):
        if not path.name.endswith(".tmp"):
            found[path.name] = json.loads(path.read_text())
    return found


def train(jobs, mode, shim=True, v2=True, stop=False, **extra):
    out = jobs.dir / "ranks"
    out.mkdir()
    env = {"OUT_DIR": out, "RAY_TRAIN_V2_ENABLED": "1" if v2 else "0", **extra}
    proc = jobs.start("ray_train_job.py", mode, shim=shim, env=env)
    started = time.monotonic()
    before = ""
    if stop:  # SIGTERM the driver once both ranks have logged their steps
        _, before = wait_for_line(proc, "FIT: start", timeout=120)
        while len(ranks(out)) < 2 and time.monotonic() - started < 180 and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
    result = jobs.finish(proc, timeout=240, started=started, before=before)
    found = ranks(out)
    pids = [p for rank in found.values() for p in [rank["pid"], *rank["children"]]]
    jobs.track(pids)
    return result, found, pids


def rank0_run(jobs, result):
    runs = jobs.runs()
    assert len(runs) == 1, result
    return runs[0][1], runs[0][2]


@pytest.mark.parametrize("v2", [pytest.param(True, marks=needs_v2), False], ids=["v2", "v1"])
def test_train_run_keeps_its_steps_and_ends_with_0(jobs, v2):
    result, found, pids = train(jobs, "return", v2=v2)
    assert "FIT: ok" in result.stdout, result
    assert len(found) == 2, result
    assert rank0_run(jobs, result) == (STEPS, [0]), result
    assert wait_gone(pids, within=10.0) == [], result


@pytest.mark.parametrize("v2", [pytest.param(True, marks=needs_v2), False], ids=["v2", "v1"])
def test_a_train_workers_processes_end_with_the_worker_group(jobs, v2):
    # Each rank starts a process that starts one in a new session: the worker group's
    # shutdown (v2: shutdown(), then ray.kill; v1: __ray_terminate__) ends them with their
    # worker, while the driver still runs (ray_guard's rule, applied by each worker's guard on
    # its node: Ray 2.40 kills v1's trial actor with no Python hook as soon as its workers are
    # gone, so nothing that watches from it would last).
    result, found, pids = train(jobs, "tree", v2=v2, AUTOTEARDOWN_RAY_GRACE_S="2")
    assert "FIT: ok" in result.stdout, result
    assert len(found) == 2, result
    assert re.search(r"^TREE_LEFT: *$", result.stdout, re.M), result
    assert wait_gone(pids, within=10.0) == [], result


@pytest.mark.baseline
@pytest.mark.parametrize("v2", [pytest.param(True, marks=needs_v2), False], ids=["v2", "v1"])
def test_without_the_shim_a_train_workers_new_session_process_is_left(jobs, v2):
    result, found, pids = train(jobs, "tree", shim=False, v2=v2, AUTOTEARDOWN_RAY_GRACE_S="2")
    left = re.search(r"^TREE_LEFT:(.*)$", result.stdout, re.M)
    print(f"without the shim: {len((left.group(1) if left else '').split())} rank process(es) left")
    assert left and left.group(1).strip(), result


@needs_v2
def test_train_function_that_raises_records_1(jobs):
    result, found, pids = train(jobs, "raise")
    assert "FIT: failed" in result.stdout, result
    assert rank0_run(jobs, result) == (STEPS, [1]), result
    assert wait_gone(pids, within=10.0) == [], result


@needs_v2
def test_driver_sigterm_records_143_for_a_running_train_function(jobs):
    result, found, pids = train(jobs, "hang", stop=True)
    assert len(found) == 2, result
    assert rank0_run(jobs, result) == (STEPS, [143]), result
    assert wait_gone(pids, within=10.0) == [], result


@needs_v2
@pytest.mark.parametrize("shim", [True, pytest.param(False, marks=pytest.mark.baseline)])
def test_a_stopped_driver_lets_each_ranks_checkpoint_in_flight_complete(jobs, shim):
    from test_checkpoint import loaded

    # The save waits 3 s: without the shim Ray's shutdown of the workers comes first. A
    # worker's teardown is bounded by the grace its group's shutdown gives it.
    result, found, pids = train(jobs, "checkpoint", shim=shim, stop=True, SLOW_WRITE_S=3,
                                AUTOTEARDOWN_RAY_GRACE_S=10)
    assert len(found) == 2, result
    assert (loaded(jobs, ranks=2, megabytes=50) == "equal") is shim, result  # the baseline: lost
    assert wait_gone(pids, within=10.0) == [], result


@needs_v2
@pytest.mark.baseline
def test_train_v2_without_the_shim_loses_the_run(jobs):
    result, found, pids = train(jobs, "return", shim=False)
    assert rank0_run(jobs, result) != (STEPS, [0]), result


@needs_v2
def test_another_ranks_failure_keeps_rank_0_and_blames_only_rank_1(jobs):
    # The group's shutdown reaches rank 0 while its training function runs: torn down
    # under it, it raised StopIteration and Ray Train logged rank 0 as failed.
    result, found, pids = train(jobs, "other-rank-raises")
    assert "FIT: failed" in result.stdout, result
    steps, codes = rank0_run(jobs, result)
    assert steps == list(range(len(steps))) and steps, result
    assert codes == [143], result
    output = result.stdout + result.stderr
    assert output.count("Error in training function") == 1 and "rank 1 failed" in output, result
    assert "StopIteration" not in output and "TrainingStopped" not in output, result
    assert wait_gone(pids, within=10.0) == [], result


@needs_v2
@pytest.mark.baseline
def test_another_ranks_failure_without_the_shim_loses_rank_0(jobs):
    result, found, pids = train(jobs, "other-rank-raises", shim=False)
    runs = jobs.runs()
    print(f"without the shim: rank 0 kept {len(runs[0][1]) if runs else 0} steps, exit records "
          f"{runs[0][2] if runs else []}")
    assert not runs or runs[0][2] == [], result
