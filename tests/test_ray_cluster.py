"""Ray clusters started separately: the shim reaches their workers through
RAY_RUNTIME_ENV_HOOK alone; a cluster whose Python has no wrapt; two nodes.

`ray start --head` (clean environment) for one node. `ray start --address` cannot
add a second one here (Ray refuses to join a head started with
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and =1 binds the machine's network address;
tests stay on loopback), but ray.cluster_utils.Cluster can: head and second node
both on 127.0.0.1. Every process of every cluster is killed by pid at the end.
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

import wandb_records
from helpers import LOAD_MARGIN, ROOT, alive, free_port, kill_pids, run, wait_gone, wait_until_empty
from test_ray import reported

GRACE = 5.0  # Ray's default grace: these clusters' workers do not get the test's environment

RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def no_wrapt_ray(folder):
    """A venv of this Python whose site-packages are this one's but wrapt: links, made in a
    second or two (see the README's Ray section); its `ray` command."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    ours = sysconfig.get_paths()["purelib"]
    theirs = sysconfig.get_paths(vars={"base": str(folder), "platbase": str(folder)})["purelib"]
    for name in os.listdir(ours):
        if name.split("-")[0] != "wrapt" and not os.path.exists(os.path.join(theirs, name)):
            os.symlink(os.path.join(ours, name), os.path.join(theirs, name))
    ray = os.path.join(folder, "bin", "ray")
    with open(ray, "w") as script:
        script.write(f"#!{folder}/bin/python\nimport sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n")
    os.chmod(ray, 0o755)
    return ray


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


@contextlib.contextmanager
def ray_start(ray):
    temp_dir = tempfile.mkdtemp(prefix="atd-ray-")  # short: Ray's socket paths must fit
    port = free_port()
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
           "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONWARNINGS": "ignore",
           "ATD_TEST_CLUSTER": temp_dir}
    common = ["--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    try:
        subprocess.run([ray, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                        *common], env=env, check=True, capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        # Ray's agents ignore SIGTERM and outlive a killed raylet: kill by pid.
        kill_pids(cluster_processes(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    with ray_start(RAY) as address:
        yield address


@pytest.fixture(scope="module")
def no_wrapt_cluster(tmp_path_factory):
    ray_command = no_wrapt_ray(tmp_path_factory.mktemp("no-wrapt"))
    python = os.path.join(os.path.dirname(ray_command), "python")
    probe = subprocess.run([python, "-c", "import importlib.util as u, ray, sys; "
                            "print(ray.__version__, sys.version_info[:2], u.find_spec('wrapt') is None)"],
                           capture_output=True, text=True, timeout=60)
    import ray

    wanted = f"{ray.__version__} {sys.version_info[:2]} True"
    assert probe.stdout.strip() == wanted, f"{python}: {probe.stdout.strip() or probe.stderr[-200:]} (need {wanted})"
    with ray_start(ray_command) as address:
        yield address


@pytest.fixture(scope="module")
def two_nodes():
    with two_node_cluster() as address:
        yield address


@contextlib.contextmanager
def two_node_cluster():
    """ray.cluster_utils.Cluster: a head (2 CPUs) and a second node (1 CPU, resource
    `second_node`), both on 127.0.0.1, started from this process in a clean environment."""
    marker = tempfile.mkdtemp(prefix="atd-2n-")
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith("AUTOTEARDOWN_") or key == "PYTHONPATH":
            del os.environ[key]  # the nodes' workers get the shim only through a job's runtime_env
    os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                       "PYTHONWARNINGS": "ignore", "ATD_TEST_CLUSTER": marker})
    from ray.cluster_utils import Cluster  # after the environment: Ray reads it at import

    cluster = None
    try:
        loopback = {"node_ip_address": "127.0.0.1"}
        cluster = Cluster(initialize_head=True, shutdown_at_exit=False,
                          head_node_args={"num_cpus": 2, "include_dashboard": False, **loopback})
        cluster.add_node(num_cpus=1, resources={"second_node": 1}, **loopback)
        os.environ.clear()
        os.environ.update(saved)
        yield cluster.address
    finally:
        os.environ.clear()
        os.environ.update(saved)
        found = cluster_processes(marker)
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.shutdown()
        kill_pids(found + cluster_processes(marker))
        shutil.rmtree(marker, ignore_errors=True)


def driver_env(address, tmp_path, **extra):
    return {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled",
            "WANDB_DIR": tmp_path, "WANDB_CACHE_DIR": tmp_path / "cache", **extra}


@pytest.mark.needs_torch
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


# ---- a cluster whose Python has Ray but not wrapt -------------------------------

def test_runtime_env_hook_works_on_a_cluster_without_wrapt(no_wrapt_cluster, tmp_path):
    # The driver only runs the hook (autoteardown disabled in it): what ends the
    # hung actors is the shim in the workers, with the wrapt the hook shipped.
    env = driver_env(no_wrapt_cluster, tmp_path, RAY_RUNTIME_ENV_HOOK="autoteardown.ray_runtime_env_hook",
                     PYTHONPATH=str(ROOT), AUTOTEARDOWN_DISABLE=1)
    result = run("ray_hung_actors.py", "inherit", shim=False, env=env, timeout=180)
    kill_pids([int(p) for p in reported(result, "PIDS") + reported(result, "BYSTANDER")])
    assert result.returncode == 0, result
    assert reported(result, "ALIVE") == [], result
    assert float(reported(result, "GONE_AFTER")[0]) <= GRACE + 2 + LOAD_MARGIN / 2, result  # the tight figure: tests/benchmark_ray.py
    assert "could not apply" not in result.stderr, result


# ---- two nodes -----------------------------------------------------------------

def test_a_hung_actor_on_the_other_node_is_gone_within_grace_plus_1s(two_nodes, tmp_path):
    # Twice the margin here: the kill task needs a new worker process on the other node,
    # and its start is what a loaded machine slows most (8.56 s, then over 9 s, seen with
    # two busy loops beside the suite). The script watches as long as the bound allows.
    bound = GRACE + 1 + 2 * LOAD_MARGIN
    env = driver_env(two_nodes, tmp_path, HUNG_ON_NODE="second_node", WATCH_S=bound + 1)
    result = run("ray_hung_actors.py", "off", shim=True, env=env, timeout=180)
    kill_pids([int(p) for p in reported(result, "PIDS") + reported(result, "BYSTANDER")])
    assert result.returncode == 0, result
    assert reported(result, "ALIVE") == [], result
    assert float(reported(result, "GONE_AFTER")[0]) <= bound, result  # the tight figure: tests/benchmark_ray.py
    assert reported(result, "BYSTANDER_ALIVE") == ["True"], result


def test_an_actors_process_tree_on_the_other_node_ends_with_it(two_nodes, jobs):
    # Its workers have no autoteardown: the task pinned there tells the tree by parent chain.
    from test_ray_tree import GRACE, released, tree_job

    result, tree, folder = tree_job(jobs, "terminate", RAY_ADDRESS=two_nodes, RAY_AUTH_MODE="disabled",
                                    TREE_ON_NODE="second_node")
    # The kill task needs a new worker there (the margin twice, as above).
    assert wait_until_empty(lambda: alive(tree), within=2 * GRACE + 2 * LOAD_MARGIN) == [], result
    assert released(folder), result
    assert result.returncode == 0, result


TREE_ELSEWHERE = {"RAY_AUTH_MODE": "disabled", "TREE_ON_NODE": "second_node", "AUTOTEARDOWN_RAY_GRACE_S": GRACE}


@pytest.mark.parametrize("ending", ["end", "shutdown", "crash"])
def test_an_idle_or_crashed_actors_tree_on_the_other_node_ends(two_nodes, jobs, ending):
    # The actor recorded nothing: psutil here cannot see its node, so it said so when it started
    # a process (the workers get autoteardown through the runtime_env hook). A crashed one's tree
    # is ended by its guard there, while the driver lives.
    from test_ray_tree import assert_ended_while_the_driver_lives, released, reported_trees, tree_job

    result, tree, folder = tree_job(jobs, ending, RAY_ADDRESS=two_nodes, **TREE_ELSEWHERE,
                                    RAY_RUNTIME_ENV_HOOK="autoteardown.ray_runtime_env_hook")
    assert wait_until_empty(lambda: alive(tree), within=2 * GRACE + 2 * LOAD_MARGIN) == [], result
    assert released(folder), result  # SIGTERM first
    assert result.returncode == 0, result
    if ending == "end":  # ended by the driver's exit: in its report
        assert any("descendant(s) ended" in outcome for outcome in reported_trees(jobs)), result
    if ending == "crash":  # by its guard there, while the driver lives
        assert_ended_while_the_driver_lives(jobs, result)


@pytest.mark.parametrize("ending", ["nested", "dropped"])
def test_an_actor_that_ends_first_hands_on_the_ending_of_its_actor_on_the_other_node(two_nodes, jobs, ending):
    # Holder, here, ends its busy Engine there and is ended at once (dropped: with no Python
    # hook): a task watching the Engine would be Holder's, and Ray kills a task with its owner,
    # so the Engine's guard on its node ends it and its processes (ray_guard.py).
    from test_ray_tree import released, tree_job

    result, tree, folder = tree_job(jobs, ending, RAY_ADDRESS=two_nodes, **TREE_ELSEWHERE,
                                    RAY_RUNTIME_ENV_HOOK="autoteardown.ray_runtime_env_hook")
    assert wait_until_empty(lambda: alive(tree), within=2 * GRACE + 2 * LOAD_MARGIN) == [], result
    assert released(folder), result  # SIGTERM first
    assert result.returncode == 0, result


@pytest.mark.baseline
def test_without_the_shim_an_idle_actors_tree_on_the_other_node_is_left(two_nodes, jobs):
    from test_ray_tree import tree_job

    result, tree, _ = tree_job(jobs, "end", shim=False, RAY_ADDRESS=two_nodes, **TREE_ELSEWHERE)
    left = wait_until_empty(lambda: alive(tree), within=2 * GRACE + 2 * LOAD_MARGIN)
    print(f"without the shim, another node: {len(left)} of {len(tree)} of the actor's processes left")
    assert left, result


@pytest.mark.needs_torch
@pytest.mark.parametrize("how", ["detached-job", "detached-option"])
def test_a_detached_actor_keeps_its_run_open_after_the_driver_exits(two_nodes, how, tmp_path):
    env = driver_env(two_nodes, tmp_path, RAY_RUNTIME_ENV_HOOK="autoteardown.ray_runtime_env_hook")
    result = run("ray_task_runner.py", how, shim=True, env=env, timeout=180)
    pids = [int(p) for p in reported(result, "ACTOR") + reported(result, "CHILDREN")]
    try:
        assert result.returncode == 0, result
        time.sleep(2.0)  # what the driver's exit would have done to the actor is done by now
        assert alive(pids[:1]) == pids[:1], result  # the service keeps running
        records = wandb_records.records(wandb_records.run_files(tmp_path)[0])
        assert wandb_records.exit_codes(records) == [], result  # its run is still open
    finally:
        kill_pids(pids)
        wait_gone(pids, within=5.0)
