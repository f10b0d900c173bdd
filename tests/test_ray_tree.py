"""An actor's process tree ends with it (integrations/ray_guard.py): an actor starts an
engine-shaped tree (a multiprocessing spawn child whose process starts a worker in a new
session; a subprocess child with a child of its own: tests/scripts/ray_tree_job.py), then
is busy, and the job ends one way. Nothing of the tree runs 2 x grace after the ending, the
new-session worker got SIGTERM first (it writes "released"), the driver's own process
(BYSTANDER) is never signalled, and the driver's status is what it is without the shim."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from helpers import LOAD_MARGIN, alive, reported, tracebacks, wait_for_line, wait_until_empty

pytest.importorskip("ray")
GRACE = 2.0
# Ray's exit of an actor that has children can hang in its interpreter's last garbage
# collection (without the shim too): the reaper kills it at the grace, in one line.
REAPED = re.compile(r"autoteardown: WARNING: \w+ \w+ \(pid \d+\) still running [\d.]+s after \S+: killed\n")
ENDINGS = ["end", "end-record", "sigterm", "group", "shutdown", "terminate", "hang", "kill", "crash", "segfault",
           "nested", "dropped"]


def tree_job(jobs, ending, shim=True, **env):
    """Run the job to its `ending`; (result, the tree's pids and the actor's, the tree folder)."""
    folder = jobs.dir / "tree"
    folder.mkdir(exist_ok=True)
    name, _, record = ending.partition("-")
    proc = jobs.start("ray_tree_job.py", name, *[record] if record else [], shim=shim,
                      env={"TREE_DIR": folder, "AUTOTEARDOWN_RAY_GRACE_S": GRACE,
                           "AUTOTEARDOWN_REPORT": jobs.dir / "report.jsonl", **env})
    _, before = wait_for_line(proc, "READY", timeout=180)
    if name in ("sigterm", "group"):
        (os.killpg if name == "group" else os.kill)(proc.pid, signal.SIGTERM)
    result = jobs.finish(proc, timeout=120, before=before)
    tree = [int(p) for p in re.search(r"^TREE:(.*)$", result.stdout, re.M).group(1).split()]
    actor = [int(p) for p in re.findall(r"^ACTOR: (\d+)", result.stdout, re.M)]
    jobs.track(tree)  # killed at cleanup whatever happens (the worker is in a session of its own)
    return result, actor + tree, folder


def assert_ended_while_the_driver_lives(jobs, result):
    """A crashed actor's tree: gone within the grace + 1 s of the crash (the actor wrote its time; the
    driver watched the tree), by its guard (ray_guard.py), while the driver ran on: not in its exit's report."""
    (gone_ms,) = reported(result.stdout, "TREE_GONE")
    assert gone_ms / 1000 <= GRACE + 1 + LOAD_MARGIN, result
    print(f"crashed actor's tree gone {gone_ms / 1000:.2f} s after the crash")
    assert reported_trees(jobs) == [], result


def reported_trees(jobs):
    """The outcomes in the teardown reports that name an actor's descendants ended."""
    path = jobs.dir / "report.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [step["outcome"] for line in lines for step in line.get("steps", [])
            if "descendant(s) ended" in step["outcome"]]


def released(folder):
    """The pids of the new-session workers that got SIGTERM; each got it once (two watches, the
    driver's and the guard's, each sending it: a handler that takes a second SIGTERM as "now"
    would cut its own release short)."""
    found = {name: (pathlib.Path(folder) / name).read_text().splitlines() for name in os.listdir(folder)
             if name.isdigit()}
    assert all(lines == ["released"] for lines in found.values()), found
    return sorted(found)


@pytest.mark.parametrize("ending", ENDINGS)
def test_nothing_an_actor_started_outlives_it(jobs, ending):
    result, tree, folder = tree_job(jobs, ending)
    assert wait_until_empty(lambda: alive(tree), within=2 * GRACE + LOAD_MARGIN) == [], result
    assert released(folder), result  # SIGTERM first: the new-session worker ran its handler
    (bystander,) = [int(p) for p in re.findall(r"^BYSTANDER: (\d+)", result.stdout, re.M)]
    assert alive([bystander]) == [bystander], result  # the driver's own process is never signalled
    if ending in ("end", "end-record", "sigterm"):  # ended by the driver's exit: in its report
        assert any(re.search(r"Engine \w{8} \(pid \d+\): \d+ descendant\(s\) ended", outcome)
                   for outcome in reported_trees(jobs)), (reported_trees(jobs), result)
    if ending in ("crash", "segfault"):
        assert_ended_while_the_driver_lives(jobs, result)
    if ending in ("sigterm", "group"):
        assert result.returncode != 0, result  # Ray's status for a stopped driver, as without the shim
    else:
        assert result.returncode == 0, result
    assert tracebacks(REAPED.sub("", result.stderr)) == 0 and "autoteardown:" not in REAPED.sub("", result.stderr), result


@pytest.mark.baseline
@pytest.mark.parametrize("ending", ["end", "sigterm", "group", "crash", "segfault"])
def test_without_the_shim_an_actors_grandchildren_are_left(jobs, ending):
    result, tree, _ = tree_job(jobs, ending, shim=False)
    left = wait_until_empty(lambda: alive(tree), within=2 * GRACE + LOAD_MARGIN)
    print(f"without the shim ({ending}): {len(left)} of {len(tree)} of the actor's processes left")
    assert left, result


def test_a_process_that_is_not_the_actors_is_never_signalled():
    from autoteardown.integrations.ray_guard import _Process, descendants

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        created = psutil.Process(stranger.pid).create_time()
        # Its pid taken by a later process: the earlier look's creation time does not match, so it
        # counts as gone and gets no signal.
        earlier = _Process(stranger.pid, created - 1.0, set(), threading.Lock())
        assert earlier.exitcode is not None
        earlier.terminate()
        earlier.kill()
        assert not earlier.killed
        # An actor "pid" created after the request is a reused pid: none of its children are its.
        assert descendants(os.getpid(), not_after=psutil.Process().create_time() - 1) == []
        assert stranger.poll() is None
        assert (stranger.pid, created) in descendants(os.getpid(), not_after=time.time())
    finally:
        stranger.kill()
        stranger.wait(10)


def test_a_guard_under_the_actor_is_not_its_process():
    # The node's guard is started from an actor: found under it, it is still not the actor's.
    from autoteardown.integrations.ray_guard import GUARD, MARKER, descendants

    reaper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, MARKER: GUARD})
    try:  # (Popen returns once the child has exec'd: its environment is the one given)
        assert reaper.pid not in dict(descendants(os.getpid(), not_after=time.time()))
    finally:
        reaper.kill()
        reaper.wait(10)


def test_a_restarted_actors_processes_are_not_the_ended_ones():
    # A restarted actor keeps its id: what carries it but was created after the actor was
    # seen gone is the new one's. (A pid no process has: the actor is gone.)
    from autoteardown.integrations.ray_guard import MARKER, clock, descendants

    gone_at = clock()
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, MARKER: "0123abcd"})
    try:
        created = psutil.Process(marked.pid).create_time()
        assert (marked.pid, created) not in descendants(2**22 + 1, gone_at, "0123abcd", gone_at=gone_at)
        while clock() < created + 0.05:  # gone well after it started: it is the ended actor's
            time.sleep(0.01)
        assert (marked.pid, created) in descendants(2**22 + 1, gone_at, "0123abcd", gone_at=clock())
    finally:
        marked.kill()
        marked.wait(10)
