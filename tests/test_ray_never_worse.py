"""Ray with the shim is never worse than without it: the same script, with and without the
shim, ends with the same status and results, in no more time than its bounds allow, and leaves
nothing behind."""

import pytest

from helpers import LOAD_MARGIN, reported, wait_gone

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
