"""The exit engine under any signal sequence and any ending (tests/scripts/signals_job.py):
SIGTERM unwinds the main thread and the process still dies of it; a second SIGTERM, a
swallowed SystemExit, a chained handler, a fork child, a caught SystemExit, a stale
sys.last_value, a hung finalizer on Python 3.12.1, a SIGTERM during the exit teardown, a
Ctrl-C during the user's finalize(). Each asserts what the process would do without the
shim (the status) and what the shim adds (the wandb run complete, nothing left).

Runs without torch too (the CI legs on Python 3.10, 3.12, 3.13): tests that need it say so.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers import LOAD_MARGIN, ROOT, base_env, noise, python, tracebacks, wait_for_line, wait_gone, wait_session_gone

TIMEOUT = 4  # AUTOTEARDOWN_TIMEOUT for these scripts
STEPS = list(range(10))
SIGTERM_CODE = 128 + signal.SIGTERM


def warnings(result):
    return [line for line in result.stderr.splitlines() if line.startswith("autoteardown: WARNING")]


def signalled(jobs, mode, *signals, args=(), shim=True, gap=0.05, group=False, **env):
    """Start the script (`mode`, then `args`), wait for READY, send the signals `gap` apart (to its
    whole process group if `group`); (result, seconds from the first signal to the end)."""
    proc = jobs.start("signals_job.py", mode, *args, shim=shim, **{"AUTOTEARDOWN_TIMEOUT": TIMEOUT, **env})
    _, before = wait_for_line(proc, "READY", timeout=120)
    sent = time.monotonic()
    for index, signum in enumerate(signals):
        if index:
            time.sleep(gap)
        if group:
            os.killpg(proc.pid, signum)  # it is a session leader (helpers.start)
        else:
            proc.send_signal(signum)
    result = jobs.finish(proc, timeout=60, before=before)
    return result, result.ended - sent


def assert_nothing_left(result):
    reported = result.pids("PIDS") + result.pids("CORE")
    assert wait_gone(reported, within=TIMEOUT + LOAD_MARGIN) == [], result
    assert wait_session_gone(result.pid, within=TIMEOUT + LOAD_MARGIN) == [], result


@pytest.mark.needs_torch
def test_two_sigterms_50ms_apart(jobs):
    result, took = signalled(jobs, "twice", signal.SIGTERM, signal.SIGTERM)
    assert result.returncode == -signal.SIGTERM, result
    assert took < TIMEOUT + LOAD_MARGIN, result
    assert jobs.runs() == [("main", STEPS, [SIGTERM_CODE])], result
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result
    assert len(result.pids("PIDS")) == 4
    assert_nothing_left(result)


@pytest.mark.needs_torch
def test_a_sigterm_to_the_whole_process_group(jobs):
    # torchrun and SLURM signal the process group: the DataLoader workers die with the
    # script, and torch's SIGCHLD handler raised "killed by signal" into the unwinding,
    # into threading._shutdown (which then skipped our exit hook) or into the teardown.
    result, took = signalled(jobs, "twice", signal.SIGTERM, group=True, AUTOTEARDOWN_DEBUG=1)
    assert result.returncode == -signal.SIGTERM, result
    assert took < TIMEOUT + LOAD_MARGIN, result
    assert "killed by signal" not in result.stderr and tracebacks(result.stderr) == 0, result
    assert "Exception ignored" not in result.stderr, result
    assert re.search(r"finalized in \S+s: dataloader ", result.stderr), result
    assert re.search(r"DEBUG: teardown done in \S+s: \d+ finalized", result.stderr), result
    assert_nothing_left(result)


@pytest.mark.baseline
@pytest.mark.needs_torch
def test_two_sigterms_without_the_shim_lose_the_run(jobs):
    result, _ = signalled(jobs, "twice", signal.SIGTERM, signal.SIGTERM, shim=False)
    assert result.returncode == -signal.SIGTERM, result
    assert [codes for _, _, codes in jobs.runs()] != [[SIGTERM_CODE]], result


def test_code_that_swallows_the_systemexit_is_ended_within_the_deadline(jobs):
    result, took = signalled(jobs, "swallow", signal.SIGTERM)
    assert "SWALLOWED" in result.stdout, result  # the SystemExit reached the user's code
    assert result.returncode == -signal.SIGTERM, result
    assert took < TIMEOUT + LOAD_MARGIN, result
    assert jobs.runs() == [("main", STEPS, [SIGTERM_CODE])], result
    assert_nothing_left(result)


NESTED = """
import os, signal
from autoteardown import signals

def sigchld_like(signum, frame):  # torch's SIGCHLD handler, reporting a worker the group SIGTERM killed
    raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Terminated.")

signal.signal(signal.SIGUSR1, sigchld_like)
# What the engine does first in our handler; the worker's death lands meanwhile: a handler that
# runs nested in ours, at its next bytecode.
signals.install(lambda signum: signal.raise_signal(signal.SIGUSR1), lambda *args: None)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):
        pass
except BaseException as exc:
    print("UNWOUND:", type(exc).__name__, exc.args, signals.received() is not None)
"""


def test_a_handler_that_runs_nested_in_ours_does_not_stop_it():
    # A group SIGTERM (torchrun, SLURM) kills the DataLoader workers with the process: torch's
    # SIGCHLD handler can run nested in ours, and what it raises must not take the SIGTERM's place.
    result = python(NESTED, shim=False, pythonpath=ROOT, timeout=60)
    assert "UNWOUND: Stop (143,) True" in result.stdout, result


def test_a_handler_chaining_to_ours_runs_its_own_code_and_decides(jobs):
    # Nothing here is timed: the run's finish gets a deadline that holds under load.
    result, _ = signalled(jobs, "chained", signal.SIGTERM, AUTOTEARDOWN_TIMEOUT=TIMEOUT + LOAD_MARGIN)
    assert result.returncode == 0, result  # its sys.exit(0), not -15
    assert "SAVED: checkpoint" in result.stdout, result
    assert jobs.runs() == [("main", STEPS, [0])], result  # the code the process really exits with
    assert warnings(result) == [] and tracebacks(result.stderr) == 0, result
    assert_nothing_left(result)


@pytest.mark.parametrize("handler", ["ours", "chained"])
def test_a_signal_while_wandb_hands_a_line_to_its_thread_ends_as_soon_as_without_the_shim(jobs, handler):
    # The unwind (ours, or the chained handler's sys.exit) leaves a task wandb counted and never ran:
    # wandb's own exit does not wait for its asyncio thread, so the teardown does not either.
    result, took = signalled(jobs, "midwrite", signal.SIGTERM, args=[handler])
    code = -signal.SIGTERM if handler == "ours" else 0
    assert result.returncode == code, result
    assert warnings(result) == [] and tracebacks(result.stderr) == 0, result
    assert took < TIMEOUT + LOAD_MARGIN, result  # held to the deadline, it would also have warned (above)
    assert jobs.runs() == [("main", STEPS, [SIGTERM_CODE if handler == "ours" else 0])], result
    assert_nothing_left(result)


def test_a_fork_pool_stuck_in_c_code_can_be_terminated(jobs, tmp_path):
    result = jobs.run("signals_job.py", "pool", tmp_path / "task-started", timeout=60)
    assert result.returncode == 0, result
    assert float(result.stdout.split("TERMINATE:")[1].split()[0]) < 1.0, result
    assert_nothing_left(result)


def test_a_raw_fork_child_stuck_in_c_code_dies_of_sigterm_at_once(jobs):
    result = jobs.run("signals_job.py", "rawfork", timeout=60)
    status, took = result.stdout.split("CHILD:")[1].split()[:2]
    assert int(status) == -signal.SIGTERM, result
    assert float(took) < 1.0, result


def test_a_caught_systemexit_is_forgotten(jobs):
    result = jobs.run("signals_job.py", "argparse")
    assert result.returncode == 0 and "CAUGHT: SystemExit" in result.stdout, result
    assert jobs.runs() == [("main", STEPS, [0])], result


def test_a_stale_sys_last_value_is_not_trusted(jobs):
    result = jobs.run("signals_job.py", "stale")
    assert result.returncode == 0, result
    assert jobs.runs() == [("main", STEPS, [0])], result


@pytest.mark.parametrize("exit_call", ["sys.exit(3)", pytest.param("raise SystemExit(3)", marks=pytest.mark.xfail(
    sys.version_info < (3, 12), strict=True, reason="Python < 3.12 has no hook that sees a bare SystemExit"))])
def test_a_dash_c_script_exiting_inside_a_function(jobs, exit_call):
    code = ("import sys, wandb\n"
            "run = wandb.init(project='autoteardown-tests', name='main')\n"
            "for step in range(10): run.log({'x': step})\n"
            f"def main():\n    {exit_call}\n"
            "main()\n")
    proc = jobs.popen([sys.executable, "-c", code], env=base_env(True, **jobs.env()),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result = jobs.finish(proc, timeout=120)
    assert result.returncode == 3, result
    assert jobs.runs() == [("main", STEPS, [3])], result


def test_armed_off_the_main_thread_sigterm_is_still_covered(jobs):
    result, _ = signalled(jobs, "offmain", signal.SIGTERM)
    assert result.returncode == -signal.SIGTERM, result
    assert jobs.runs() == [("main", STEPS, [SIGTERM_CODE])], result


def test_a_hung_finalizer_keeps_the_status_and_the_later_steps(jobs):
    # On Python 3.12.0-3.12.2 no thread can start during finalization: the runner was
    # started when the engine was armed (CI runs this file on 3.12.1 and 3.13.0).
    result = jobs.run("signals_job.py", "hung", AUTOTEARDOWN_TIMEOUT=TIMEOUT)
    exiting = float(result.stdout.split("EXITING:")[1].split()[0])
    assert result.returncode == 3, result
    assert result.ended - exiting < TIMEOUT + LOAD_MARGIN, result
    assert jobs.runs() == [("main", STEPS, [3])], result
    found = warnings(result)
    assert len(found) == 1 and "left behind" in found[0], result
    assert_nothing_left(result)


def test_sigterm_during_the_exit_teardown_still_finalizes_every_kind(jobs):
    result = jobs.run("signals_job.py", "exit_sigterm", AUTOTEARDOWN_TIMEOUT=TIMEOUT)
    assert result.returncode == -signal.SIGTERM, result  # as a SIGTERM at exit does without us
    assert jobs.runs() == [("main", STEPS, [SIGTERM_CODE])], result  # wandb (order 30) still finished
    assert noise(result.stderr) == [] and warnings(result) == [], result
    assert_nothing_left(result)


def test_ctrl_c_during_the_users_finalize_is_raised_again(jobs):
    result = jobs.run("signals_job.py", "interrupt", AUTOTEARDOWN_TIMEOUT=TIMEOUT)
    assert "INTERRUPTED: KeyboardInterrupt" in result.stdout, result
    assert "LIVE: wandb" in result.stdout, result  # not reached: left for the exit
    assert result.returncode == 0, result
    assert jobs.runs() == [("main", STEPS, [0])], result
    assert_nothing_left(result)


TOOLS = """
import sys
taken = sys.argv[1] == "taken"
if taken:  # a debugger and a profiler hold the ids we would take
    sys.monitoring.use_tool_id(3, "profiler"); sys.monitoring.use_tool_id(4, "debugger")
import autoteardown, wandb
class Resource: pass
resource = Resource()
ours = lambda: [i for i in range(6) if sys.monitoring.get_tool(i) == "autoteardown"]
autoteardown.registry.record("probe", resource)  # armed at the first record
first = ours()
autoteardown.uninstall()
after = ours()
autoteardown.install()
autoteardown.registry.record("probe", resource)
print(first, after, ours(), hasattr(sys.exit, "__wrapped__"))
"""


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is Python 3.12+")
@pytest.mark.parametrize("ids", ["free", "taken"])
def test_uninstall_and_install_use_one_monitoring_tool_id(ids):
    result = python(TOOLS, ids, shim=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    expected = "[4] [] [4] False" if ids == "free" else "[] [] [] True"  # taken: sys.exit is watched instead
    assert result.stdout.strip() == expected, result.stdout
