"""wandb online, against the tests' W&B stand-in (tests/wandb_server.py, a server in its own
process): a server that stalls (accepts, never answers) or goes away once the script has logged
its steps never holds the job at its end, and loses nothing: the job is gone within
AUTOTEARDOWN_TIMEOUT + 3 s, the local run file holds every step and the exit record, no
wandb-core is left, and one line names the run and how to upload it later. That holds too
when the script ends its run itself (`run.finish()`, a `with wandb.init()` block): its finish
is let go after AUTOTEARDOWN_TIMEOUT s without progress. Without the shim (baselines,
reported) the job is still running at that bound, or loses its steps.
"""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from helpers import LOAD_MARGIN, alive, free_port, kill_tree, python, reported, wait_for_line, wait_gone  # noqa: E402
from wandb_records import exit_codes, history_steps, records, run_files  # noqa: E402
from wandb_server import exit_codes as exit_codes_received  # noqa: E402
from wandb_server import history_steps as history_steps_received  # noqa: E402
from wandb_server import wait_listening  # noqa: E402

TIMEOUT = 5.0  # AUTOTEARDOWN_TIMEOUT here
STEPS = list(range(20))  # what wandb_online_job.py logs
# The script's own finish: let go after TIMEOUT s without progress, then the exit's own deadline.
OWN_FINISH = {"finish", "with"}
ENDINGS = {"normal": (0, 0), "raise": (1, 1), "exit3": (3, 3), "sigterm": (-15, 143), "finish": (0, 0), "with": (0, 0)}


class Server:
    def __init__(self, folder):
        self.port, self.record, self.mode = free_port(), folder / "received.jsonl", folder / "mode"
        self.mode.write_text("answer")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "wandb_server.py"), str(self.port),
                                      str(self.record), str(self.mode)], start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_listening(self.port), "the stand-in did not start"

    def switch(self, mode):
        self.mode.write_text(mode)
        if mode == "gone":  # refused from now on
            deadline = time.monotonic() + 10
            while wait_listening(self.port, within=0.1) and time.monotonic() < deadline:
                time.sleep(0.05)


@pytest.fixture
def server(tmp_path):
    server = Server(tmp_path)
    try:
        yield server
    finally:
        server.proc.kill()
        server.proc.wait(10)


def online_job(jobs, server, ending, failure, shim=True, within=None, script="wandb_online_job.py"):
    """Run the script until READY, make the server fail, let the script end; (Run or None if it
    still runs at the bound, seconds from its end to the last of its processes, the pids of
    wandb-core, or of the TaskRunner actor and its children, which must be gone too)."""
    go = jobs.dir / "go"
    env = {"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{server.port}", "WANDB_API_KEY": "a" * 40,
           "GO_FILE": go, "AUTOTEARDOWN_TIMEOUT": TIMEOUT, "WANDB_DIR": jobs.dir}
    proc = jobs.start(script, ending, shim=shim, env=env)
    _, before = wait_for_line(proc, "READY", timeout=180)
    cores = reported(before, "CORE") + reported(before, "ACTOR") + reported(before, "CHILDREN")
    jobs.track(cores)
    server.switch(failure)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM) if ending == "sigterm" else go.touch()
    bound = began + (within or allowed(ending)) + LOAD_MARGIN
    while proc.poll() is None and time.monotonic() < bound:
        time.sleep(0.05)
    ended = proc.poll() is not None
    if not ended:
        kill_tree(proc.pid)
    left = wait_gone(cores, within=LOAD_MARGIN) if ended else alive(cores)
    took = time.monotonic() - began  # the script and wandb-core gone
    result = jobs.finish(proc, timeout=60, before=before)
    return (result if ended else None), took, cores, left


def allowed(ending):
    """Seconds from the script's end to the last of its processes: the deadline and 3 s (twice
    the deadline when the script finishes its run itself: the finish's bound, then the exit's)."""
    return TIMEOUT * (1 + (ending in OWN_FINISH)) + 3


def local_run(jobs):
    """(history steps, exit codes) of the one local run file."""
    files = run_files(jobs.dir)
    assert len(files) == 1, files
    recs = records(files[0])
    return history_steps(recs), exit_codes(recs)


@pytest.mark.parametrize("failure", ["stall", "gone"])
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_failing_server_never_holds_the_job_and_loses_nothing(jobs, server, ending, failure):
    status, code = ENDINGS[ending]
    result, took, cores, left = online_job(jobs, server, ending, failure)
    assert result is not None and result.returncode == status, (took, result)
    assert took < allowed(ending), (took, result)
    assert len(cores) == 1 and left == [], result
    # A finish left waiting for the server: wandb-core writes the exit record again at its teardown.
    steps, codes = local_run(jobs)
    assert steps == STEPS and codes and set(codes) == {code}, (steps, codes, result)
    assert "`wandb sync --include-online " in result.stderr, result


@pytest.mark.parametrize("ending", sorted(OWN_FINISH))
def test_the_scripts_own_finish_is_never_cut_while_its_upload_moves(jobs, server, ending):
    # Each request answered 2 s after it came: the finish takes longer than TIMEOUT, and moves.
    result, took, cores, left = online_job(jobs, server, ending, "slow 2", within=60)
    assert result is not None and result.returncode == 0 and left == [], (took, result)
    assert "not uploaded" not in result.stderr and took > TIMEOUT, (took, result)
    run_id = re.search(r"^RUN: (\S+)", result.stdout, re.M).group(1)
    assert history_steps_received(server.record, run_id) == STEPS, result
    assert exit_codes_received(server.record, run_id) == [0], result


@pytest.mark.needs_torch
@pytest.mark.parametrize("failure", ["stall", "gone"])
def test_a_verl_task_runner_actor_never_holds_the_job_and_loses_nothing(jobs, server, failure):
    # ray_task_runner.py: the actor logs 20 steps online, then the driver simply ends.
    result, took, pids, left = online_job(jobs, server, "end", failure, script="ray_task_runner.py")
    assert result is not None and result.returncode == 0, (took, result)
    assert took < allowed("end") and left == [], (took, left, result)
    steps, codes = local_run(jobs)
    assert steps == STEPS and set(codes) == {0}, (steps, codes, result)  # written again at teardown
    assert "`wandb sync --include-online " in result.stderr, result


def test_the_named_sync_uploads_every_step_once_the_server_answers(jobs, server):
    result, _, _, _ = online_job(jobs, server, "normal", "stall")
    command = re.search(r"`(wandb sync [^`]+)`", result.stderr).group(1).split()
    run_id = re.search(r"^RUN: (\S+)", result.stdout, re.M).group(1)
    server.switch("answer")
    assert history_steps_received(server.record, run_id) == [], "nothing reached the server before"
    synced = python([str(Path(sys.executable).parent / command[0]), *command[1:]], shim=False, timeout=120,
                    cwd=jobs.dir, env={"WANDB_BASE_URL": f"http://127.0.0.1:{server.port}", "WANDB_API_KEY": "a" * 40})
    assert synced.returncode == 0, synced
    assert history_steps_received(server.record, run_id) == STEPS, synced
    assert exit_codes_received(server.record, run_id) == [0], synced


@pytest.mark.baseline
@pytest.mark.parametrize("failure", ["stall", "gone"])
@pytest.mark.parametrize("ending", ["normal", "sigterm", "finish"])
def test_without_the_shim_a_failing_server_holds_the_job_or_loses_it(jobs, server, ending, failure):
    result, took, _, left = online_job(jobs, server, ending, failure, shim=False)
    held = result is None or left != []
    assert held or local_run(jobs)[0] != STEPS, (took, result)
