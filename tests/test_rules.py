"""The core's rules, one test per place each covers (README "How it works"): a normal end
waits for non-daemon threads; after a SIGTERM the user's code does not run on; the unwind
is raised where it cannot be lost (finalizers, `with` blocks of our resources) and the
handler takes no lock; uninstall stops the helper before closing its pipe; multiprocessing
children are torn down before multiprocessing's exit function and ended with a stopped
parent; armed at the first record; bounded configuration; the report always says something."""

import json
import signal
import sys
import time

import pytest

from helpers import LOAD_MARGIN, tracebacks, wait_for_line, wait_gone, wait_session_gone

pytestmark = pytest.mark.needs_torch
TIMEOUT = 20.0  # AUTOTEARDOWN_TIMEOUT here: half of it (10 s) is what the old fallbacks took


def stopped(jobs, mode, delay=0.3, **env):
    """Start MODE, send SIGTERM once it is READY; the Run and the time from signal to end."""
    proc = jobs.start("rules_job.py", mode, AUTOTEARDOWN_TIMEOUT=TIMEOUT, **env)
    _, before = wait_for_line(proc, "READY")
    time.sleep(delay)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    result = jobs.finish(proc, before=before)
    return result, result.ended - sent


def assert_nothing_left(result):
    assert wait_gone(result.pids("PIDS"), within=LOAD_MARGIN) == [], result
    assert wait_session_gone(result.pid, within=LOAD_MARGIN) == [], result


def test_a_normal_end_waits_for_a_non_daemon_thread_and_its_dataloader(jobs):
    result = jobs.run("rules_job.py", "thread")
    assert result.returncode == 0 and "THREAD: 150" in result.stdout, result
    assert tracebacks(result.stderr) == 0, result
    assert_nothing_left(result)


@pytest.mark.parametrize("mode", ["waitmain", "spawnwait"])
@pytest.mark.parametrize("how", ["join", "alive"])
def test_a_normal_end_never_waits_on_a_thread_that_waits_for_the_main_thread(jobs, mode, how):
    # Such a thread ends when Python marks the main thread stopped, before it joins the others;
    # a teardown that waited for the threads before that would wait for ever.
    without = jobs.run("rules_job.py", mode, how, shim=False, timeout=60 + LOAD_MARGIN)
    result = jobs.run("rules_job.py", mode, how, timeout=60 + LOAD_MARGIN)
    assert result.returncode == without.returncode == 0, (result, without)
    assert f"WAITED: {how}" in result.stdout and f"WAITED: {how}" in without.stdout, (result, without)
    assert ("CHILD: 0" in result.stdout) == ("CHILD: 0" in without.stdout), (result, without)
    assert tracebacks(result.stderr) == 0 and "killed by signal" not in result.stderr, result
    assert result.elapsed < without.elapsed * 1.10 + 0.2 + LOAD_MARGIN, (result, without)
    assert_nothing_left(result)


def test_the_users_code_does_not_run_on_once_the_teardown_has_started(jobs):
    # SIGTERM lands while the main thread is in C code: the helper starts the teardown;
    # the main thread comes back meanwhile and must unwind, not train another step.
    proc = jobs.start("rules_job.py", "stuck", AUTOTEARDOWN_TIMEOUT=TIMEOUT)
    _, before = wait_for_line(proc, "READY")
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    result = jobs.finish(proc, before=before)
    assert "RAN ON" not in result.stdout, result
    assert result.returncode == -signal.SIGTERM, result
    assert jobs.runs() == [("main", list(range(10)), [143])], result
    assert_nothing_left(result)


@pytest.mark.parametrize("where", ["weakref", "gc"])
def test_a_sigterm_inside_a_finalizer_unwinds_at_once(jobs, where):
    result, took = stopped(jobs, where, delay=0, AUTOTEARDOWN_DEBUG=1)
    assert result.returncode == -signal.SIGTERM, result
    assert "Exception ignored" not in result.stderr and tracebacks(result.stderr) == 0, result
    assert took < TIMEOUT / 2, result  # not the helper's fallback at half the deadline
    assert "teardown done" in result.stderr and "finalized in" in result.stderr, result
    assert_nothing_left(result)


def test_our_unwind_through_with_wandb_init_is_no_error(jobs):
    result, _ = stopped(jobs, "with")
    assert result.returncode == -signal.SIGTERM, result
    assert tracebacks(result.stderr) == 0 and "SystemExit" not in result.stderr, result
    assert jobs.runs() == [("main", list(range(10)), [143])], result


def test_a_sigterm_while_the_main_thread_holds_the_timers_lock(jobs):
    result = jobs.run("rules_job.py", "lock", AUTOTEARDOWN_TIMEOUT=4, timeout=60)
    assert result.returncode == -signal.SIGTERM, result
    assert result.elapsed < 4 + 1 + LOAD_MARGIN, result
    assert_nothing_left(result)


def test_uninstall_stops_the_helper_before_closing_its_pipe(jobs):
    result = jobs.run("rules_job.py", "uninstall")
    assert result.returncode == 0 and "PIPE: mine" in result.stdout, result


def test_a_spawn_child_tears_down_before_multiprocessings_exit_function(jobs, tmp_path):
    out = tmp_path / "report.jsonl"
    result = jobs.run("rules_job.py", "spawnchild", AUTOTEARDOWN_REPORT=out)
    assert result.returncode == 0 and "CHILD: 0" in result.stdout, result
    assert "MPEXIT: 0" in result.stdout, result  # shut down by the teardown, not SIGTERMed by it
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    (step,) = line["steps"]
    assert step["outcome"] == "finalized" and step["resource"].endswith(": stopped)"), line
    assert_nothing_left(result)


def test_the_report_says_when_it_cannot_be_written(jobs, tmp_path):
    path = tmp_path / "missing" / "report.jsonl"
    result = jobs.run("rules_job.py", "dropped", AUTOTEARDOWN_REPORT=path)
    assert result.returncode == 0, result
    assert result.stderr.count(str(path)) == 1 and "cannot be written" in result.stderr, result


def test_a_process_with_nothing_left_at_exit_still_writes_its_line(jobs, tmp_path):
    out = tmp_path / "report.jsonl"
    result = jobs.run("rules_job.py", "dropped", AUTOTEARDOWN_REPORT=out)
    assert result.returncode == 0, result
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    assert line["trigger"] == "normal end" and line["code"] == 0 and line["steps"] == [], line


def test_a_caught_sys_exit_is_not_handed_on_for_another_exit(jobs, tmp_path):
    out = tmp_path / "report.jsonl"
    result = jobs.run("rules_job.py", "exitcodes", AUTOTEARDOWN_REPORT=out)
    assert result.returncode == 5, result
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    # 3.12+ sees the bare raise; before, Python hides it (README): never the caught 2.
    assert line["code"] == (5 if sys.version_info >= (3, 12) else 0), line


def test_a_spawn_dataloader_worker_is_not_armed(jobs):
    result = jobs.run("rules_job.py", "spawnworker")
    assert result.returncode == 0 and "ARMED: False -" in result.stdout, result


def test_an_overflowing_timeout_is_refused():
    from helpers import python

    code = "import autoteardown.config as c; print(c.TIMEOUT)"
    result = python(code, env={"AUTOTEARDOWN_TIMEOUT": "1e10"}, timeout=60)
    assert result.stdout.strip() == "10.0", result
    assert result.stderr.count("AUTOTEARDOWN_TIMEOUT") == 1, result


def test_a_stopped_parent_ends_its_process_pool(jobs):
    result, took = stopped(jobs, "pool")
    assert result.returncode == -signal.SIGTERM, result
    workers = result.pids("PIDS")[2:]
    assert len(workers) == 2, result
    assert wait_gone(workers, within=LOAD_MARGIN) == [], result
    assert took < TIMEOUT + 1 + LOAD_MARGIN, result
    assert_nothing_left(result)
