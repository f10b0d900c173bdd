"""Process groups never destroyed by a 2-rank gloo job: destroyed at exit on each rank.

The ranks are started as torchrun starts them (env://, one process per rank), so
each rank's status and output are its own; one test goes through torchrun itself.
The NCCL warning at exit ("process group has NOT been destroyed") needs a GPU:
none here, so it is not tested.
"""

import re
import subprocess
import sys
import time

import pytest

from helpers import LOAD_MARGIN, ROOT, SCRIPTS, base_env, free_port, noise, python, reported, wait_gone

pytestmark = pytest.mark.needs_torch

# With AUTOTEARDOWN_TIMEOUT at 60 s, a destroy that waited for the other rank would make
# a run of over a minute, where these take 2 to 8 s: a run under TIMEOUT / 2 did not wait.
TIMEOUT = 60


def ranks(jobs, mode, shim=True, env=None, timeout=TIMEOUT + 60):
    """Run the job's two ranks; return their results, rank 0 first (elapsed: from the start)."""
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port(), "WORLD_SIZE": 2,
              "AUTOTEARDOWN_TIMEOUT": TIMEOUT, **(env or {})}
    began = time.monotonic()
    procs = [jobs.start("distributed_job.py", mode, shim=shim, env={**common, "RANK": r, "LOCAL_RANK": r})
             for r in (0, 1)]
    return [jobs.finish(proc, timeout, started=began) for proc in procs]


def at_exit(result):
    """What the script's own atexit hook saw, per rank: {rank: initialized}."""
    # Not anchored to lines: spawned ranks share one stdout and their lines can interleave.
    return {int(r): v == "True" for r, v in re.findall(r"RANK (\d) AT EXIT: initialized=(True|False)",
                                                       result.stdout)}


def pids(result):
    return reported(result.stdout, "PID")  # "RANK n PID: pid", unanchored


def clean(result):
    # "terminate called without an active exception": a C++ thread of the
    # undestroyed group at teardown, which then dies of SIGABRT (5 of 20 runs without the shim).
    return noise(result.stderr) == [] and "terminate called" not in result.stderr


@pytest.mark.parametrize("mode", ["normal", "subgroup"])
def test_each_rank_destroys_its_groups_at_exit(jobs, mode):
    results = ranks(jobs, mode)
    for rank, result in enumerate(results):
        assert result.returncode == 0, result
        assert at_exit(result) == {rank: False}, result
        assert clean(result) and result.stderr == "", result
        assert result.elapsed < TIMEOUT / 2, result
        assert wait_gone(pids(result), within=LOAD_MARGIN) == []


@pytest.mark.baseline
def test_without_the_shim_the_groups_outlive_the_script(jobs):
    results = ranks(jobs, "normal", shim=False)
    for rank, result in enumerate(results):
        assert at_exit(result) == {rank: True}, result


@pytest.mark.parametrize("shim", [True, pytest.param(False, marks=pytest.mark.baseline)])
def test_ranks_ending_apart_for_different_reasons(jobs, shim):
    # Rank 0 exits first and takes the TCPStore with it; rank 1 raises 2 s later.
    # Destroying never waits for the other rank: the statuses the script chose (without
    # the shim the group left to C++ destructors can abort rank 0 at exit: -6, seen in CI).
    rank0, rank1 = ranks(jobs, "apart", shim=shim)
    assert at_exit(rank0) == {0: not shim} and at_exit(rank1) == {1: not shim}, (rank0, rank1)
    assert "ValueError: the user's own error" in rank1.stderr
    if shim:
        assert rank1.returncode == 1 and len(re.findall(r"Traceback", rank1.stderr)) == 1, rank1
        assert rank1.elapsed < TIMEOUT / 2, rank1
        assert rank0.returncode == 3 and rank0.stderr == "", rank0


def test_through_torchrun(jobs):
    began = time.monotonic()
    proc = jobs.popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         str(SCRIPTS / "distributed_job.py"), "subgroup"],
        env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result = jobs.finish(proc, timeout=TIMEOUT + 60, started=began)
    assert result.returncode == 0, result  # torchrun's status is 0 only if every rank's is
    assert at_exit(result) == {0: False, 1: False}, result
    assert clean(result), result
    assert wait_gone(pids(result), within=LOAD_MARGIN) == []


@pytest.mark.parametrize("shim", [True, pytest.param(False, marks=pytest.mark.baseline)])
def test_through_multiprocessing_spawn(jobs, shim):
    # The spawned ranks inherit PYTHONPATH, so the sitecustomize activates in them too;
    # multiprocessing runs the exit hook from Process._bootstrap (threading._shutdown).
    result = jobs.run("distributed_spawn.py", free_port(), shim=shim, timeout=TIMEOUT + 60)
    assert at_exit(result) == {0: not shim, 1: not shim}, result
    if shim:  # without it a rank can die of SIGABRT at exit (see clean()), failing the spawn
        assert result.returncode == 0 and "ALL RANKS DONE" in result.stdout, result
    assert wait_gone(pids(result), within=LOAD_MARGIN) == []


def test_can_be_disabled(jobs):
    results = ranks(jobs, "normal", env={"AUTOTEARDOWN_DISABLED_INTEGRATIONS": "distributed"})
    for rank, result in enumerate(results):
        assert at_exit(result) == {rank: True}, result


CONTRACT = """
import sys, autoteardown
assert "torch.distributed" not in sys.modules
import torch, torch.distributed as dist
from torch.distributed import distributed_c10d, device_mesh
from autoteardown.integrations import distributed as integration
from autoteardown.integrations import unsupported_reason
from autoteardown import integrations
originals = {name: original for _, name, original, _ in integrations._patches["distributed"]._patched}
assert sorted(originals) == ["init_process_group", "new_group"]
for module in (dist, distributed_c10d, device_mesh):
    for name, original in originals.items():
        assert getattr(module, name).__wrapped__ is original, (module, name)
integrations.instrument("distributed")
assert dist.init_process_group.__wrapped__ is originals["init_process_group"]  # wrapped once
assert integrations.get_version("distributed") == torch.__version__ and unsupported_reason("distributed") is None

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
subgroup = dist.new_group([0])
assert autoteardown.live() == {"process_group": [dist.group.WORLD, subgroup]}
autoteardown.finalize()
assert not dist.is_initialized() and autoteardown.live() == {}

integrations.uninstrument("distributed")
for module in (dist, distributed_c10d, device_mesh):
    for name, original in originals.items():
        assert getattr(module, name) is original, (module, name)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
assert autoteardown.live() == {}
print("OK")
"""

# A group made before autoteardown is imported is recorded when it is.
EARLY = """
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
import autoteardown
assert autoteardown.live() == {"process_group": [dist.group.WORLD]}
print("OK")
"""


@pytest.mark.parametrize("code, shim", [(CONTRACT, True), (EARLY, False)], ids=["contract", "early"])
def test_contract_and_laziness(code, shim):
    result = python(code, shim=shim, pythonpath=None if shim else ROOT, timeout=60)
    assert result.returncode == 0 and result.stdout == "OK\n", result.stderr
    assert result.stderr == ""
