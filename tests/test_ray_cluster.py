"""A Ray cluster started separately (`ray start --head`, clean environment): the
shim reaches its workers through RAY_RUNTIME_ENV_HOOK alone.

A second node cannot be tested here: Ray refuses to join one to a head started
with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and with =1 it binds the machine's
network address, and tests stay on loopback. The other-node reaping path (a
zero-CPU task pinned to the actor's node) is exercised against the local node."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile

import psutil
import pytest

import wandb_records
from helpers import ROOT, kill_pids, run
from test_ray import reported

RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_processes(marker):
    """Every process of the cluster: those that inherit ATD_TEST_CLUSTER, and all
    their descendants (Ray's agents and workers retitle themselves, which also
    blanks what /proc shows of their environment). Call it before killing any."""
    found = set()
    for process in psutil.process_iter(["pid"]):
        try:
            if process.environ().get("ATD_TEST_CLUSTER") == marker:
                found.add(process.pid)
                found.update(child.pid for child in process.children(recursive=True))
        except psutil.Error:
            pass
    return sorted(found)


@pytest.fixture(scope="module")
def cluster():
    temp_dir = tempfile.mkdtemp(prefix="atd-ray-")  # short: Ray's socket paths must fit
    port = free_port()
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
           "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONWARNINGS": "ignore",
           "ATD_TEST_CLUSTER": temp_dir}
    common = ["--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                        *common], env=env, check=True, capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        # Ray's agents ignore SIGTERM and outlive a killed raylet: kill by pid.
        kill_pids(cluster_processes(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)


def driver_env(address, tmp_path, **extra):
    return {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled",
            "WANDB_DIR": tmp_path, "WANDB_CACHE_DIR": tmp_path / "cache", **extra}


@pytest.mark.parametrize("hook", [True, False])
def test_runtime_env_hook_reaches_the_workers_of_a_separate_cluster(cluster, hook, tmp_path):
    env = driver_env(cluster, tmp_path)
    if hook:
        env["RAY_RUNTIME_ENV_HOOK"] = "autoteardown.ray_runtime_env_hook"
        env["PYTHONPATH"] = str(ROOT)  # the driver imports the hook; the workers get nothing this way
    result = run("ray_task_runner.py", "terminate", shim=False, env=env, timeout=180)
    kill_pids([int(p) for p in reported(result, "ACTOR") + reported(result, "CHILDREN")])
    assert result.returncode == 0, result
    records = wandb_records.records(wandb_records.run_files(tmp_path)[0])
    if hook:
        assert wandb_records.history_steps(records) == list(range(int(reported(result, "STEPS")[0]))), result
        assert wandb_records.exit_codes(records) == [0], result
        assert reported(result, "ACTOR_GONE") == ["True"], result
    else:  # __ray_terminate__ without the shim in the actor: wandb-core is killed first
        assert wandb_records.exit_codes(records) == [], result


def test_the_other_node_reaping_task_kills_a_hung_actor(cluster, tmp_path):
    env = driver_env(cluster, tmp_path, AUTOTEARDOWN_DISABLE=1, PYTHONPATH=str(ROOT))
    result = run("ray_reap_task.py", shim=False, env=env, timeout=120)
    kill_pids([int(p) for p in reported(result, "PIDS")])
    assert result.returncode == 0, result
    assert reported(result, "KILLED") == ["True"], result
    assert reported(result, "ALIVE") == [], result
