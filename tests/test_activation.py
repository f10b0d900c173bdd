"""Each way of turning autoteardown on, with an unmodified script in a subprocess."""

import os
import re
import shutil
import signal
import sys

import pytest

from helpers import ROOT, SCRIPTS, noise, python, tracebacks, wait_for_line, wait_gone

JOB = str(SCRIPTS / "dataloader_job.py")
RUN_JOB = f"import runpy, sys; sys.argv = [{JOB!r}, 'normal']; runpy.run_path({JOB!r}, run_name='__main__')"
CHILD_SEES_SHIM = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
                   "'import sys; print(\"CHILD\", \"autoteardown\" in sys.modules)'], check=True)")


def autoteardown_run():
    found = shutil.which("autoteardown-run", path=os.path.dirname(sys.executable))
    assert found, "autoteardown-run is not installed next to this python"
    return found


def pids_of(stdout):
    return [int(p) for line in stdout.splitlines() if line.startswith("PIDS:") for p in line.split()[1:]]


def assert_clean(result):
    assert result.returncode == 0, result.stderr
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result.stderr
    assert wait_gone(pids_of(result.stdout), within=1.0) == []


@pytest.mark.needs_torch
def test_import_in_the_script():
    code = "import autoteardown\n" + RUN_JOB
    assert_clean(python(code, shim=False, pythonpath=ROOT, timeout=90))


def test_sitecustomize_runs_the_one_it_shadows(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('SHADOWED SITECUSTOMIZE RAN')\n")
    result = python("import sys; print('AT', 'autoteardown' in sys.modules)", pythonpath=tmp_path, timeout=60)
    assert result.stdout.splitlines() == ["SHADOWED SITECUSTOMIZE RAN", "AT True"], result


@pytest.mark.needs_torch
def test_pythonstartup_in_an_interactive_session():
    startup = {"PYTHONSTARTUP": ROOT / "sitecustomize_example" / "pythonstartup.py"}
    result = python(["-i"], input=RUN_JOB + "\n", shim=False, pythonpath=ROOT, env=startup, timeout=90)
    assert_clean(result)
    # Without it the same session prints the DataLoader message.
    result = python(["-i"], input=RUN_JOB + "\n", shim=False, pythonpath=ROOT, timeout=90)
    assert "killed by signal" in result.stderr


@pytest.mark.needs_torch
def test_autoteardown_run_covers_the_script_and_its_python_children():
    result = python([JOB, "normal"], shim=False, launcher=[autoteardown_run()], timeout=90)
    assert_clean(result)
    result = python(CHILD_SEES_SHIM, shim=False, launcher=[autoteardown_run()], timeout=60)
    assert result.stdout.strip() == "CHILD True", result


def test_autoteardown_run_passes_the_exit_status_through():
    for code, status in [("pass", 0), ("import sys; sys.exit(3)", 3),
                         ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM)]:
        result = python(code, shim=False, launcher=[autoteardown_run()], timeout=60)
        assert result.returncode == status, (code, result)


def test_autoteardown_run_keeps_the_existing_pythonpath(tmp_path):
    (tmp_path / "marker_module.py").write_text("")
    result = python("import marker_module, autoteardown", shim=False, pythonpath=tmp_path,
                    launcher=[autoteardown_run()], timeout=60)
    assert result.returncode == 0, result.stderr


# ---- the shipped bootstrap, for pip users ---------------------------------------------

def sitecustomize_path():
    result = python(["-m", "autoteardown", "sitecustomize-path"], shim=False, pythonpath=ROOT, timeout=60)
    assert result.returncode == 0, result
    return result.stdout.strip()


def test_the_example_folder_runs_the_shipped_sitecustomize():
    # One source: the example only points at autoteardown/bootstrap/sitecustomize.py.
    example = (ROOT / "sitecustomize_example" / "sitecustomize.py").read_text()
    assert "autoteardown/bootstrap/sitecustomize.py" in example and "import autoteardown" not in example
    assert "bootstrap" in sitecustomize_path().split(os.pathsep)[0]


@pytest.mark.needs_torch
def test_sitecustomize_path_covers_a_sigterm_to_dataloader_and_wandb(jobs):
    from wandb_records import exit_codes, history_steps, records, run_files

    proc = jobs.start("cli_dataloader_wandb.py", shim=False, PYTHONPATH=sitecustomize_path())
    _, before = wait_for_line(proc, "READY")
    proc.send_signal(signal.SIGTERM)
    result = jobs.finish(proc, before=before)
    assert result.returncode == -signal.SIGTERM, result
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result
    assert wait_gone(result.pids("PIDS") + result.pids("CORE"), within=2.0) == [], result
    recs = records(run_files(jobs.dir)[0])
    assert history_steps(recs) == list(range(10)) and exit_codes(recs) == [143], result


def test_an_error_in_the_shadowed_sitecustomize_is_reported_as_the_users(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('MINE STARTED')\nraise ValueError('my own mistake')\n")
    result = python("import sys; print('AT', 'autoteardown' in sys.modules)",
                    shim=False, pythonpath=[sitecustomize_path(), tmp_path], timeout=60)
    assert result.returncode == 0, result
    assert result.stdout.splitlines() == ["MINE STARTED", "AT True"], result
    assert f"Error in sitecustomize ({tmp_path / 'sitecustomize.py'})" in result.stderr, result
    assert "ValueError: my own mistake" in result.stderr and "not activated" not in result.stderr, result


def test_a_broken_autoteardown_still_runs_the_shadowed_sitecustomize(tmp_path):
    broken = tmp_path / "broken"
    (broken / "autoteardown").mkdir(parents=True)
    (broken / "autoteardown" / "__init__.py").write_text("raise ImportError('half installed')\n")
    (tmp_path / "sitecustomize.py").write_text("print('MINE RAN')\n")
    bootstrap = sitecustomize_path().split(os.pathsep)[0]
    result = python("print('MAIN')", shim=False, pythonpath=[bootstrap, broken, tmp_path], timeout=60)
    assert result.returncode == 0 and result.stdout.splitlines() == ["MINE RAN", "MAIN"], result
    assert "autoteardown: not activated: ImportError: half installed" in result.stderr, result


def activation_lines(stderr):
    return re.findall(r"^autoteardown: \[pid (\d+)\] DEBUG: active in this process \(via ([^)]+)\)$", stderr, re.M)


def test_debug_confirms_the_activation_once_per_process():
    result = python(CHILD_SEES_SHIM, shim=True, env={"AUTOTEARDOWN_DEBUG": 1}, timeout=60)
    lines = activation_lines(result.stderr)
    assert [via for _, via in lines] == ["sitecustomize", "sitecustomize"], result
    assert len({pid for pid, _ in lines}) == 2, result
    result = python("import autoteardown", shim=False, pythonpath=ROOT, env={"AUTOTEARDOWN_DEBUG": 1}, timeout=60)
    assert [via for _, via in activation_lines(result.stderr)] == ["import"], result
    result = python(["-m", "autoteardown", "run", "-d", sys.executable, "-c", "pass"], shim=False, pythonpath=ROOT,
                    timeout=60)
    assert [via for _, via in activation_lines(result.stderr)] == ["autoteardown-run"], result
    result = python("import autoteardown", shim=True, env={"AUTOTEARDOWN_DEBUG": 1, "AUTOTEARDOWN_DISABLE": 1},
                    timeout=60)
    assert result.stderr.strip().splitlines() == [
        f"autoteardown: [pid {result.stderr.split('pid ')[1].split(']')[0]}] DEBUG: "
        "AUTOTEARDOWN_DISABLE=1: imported (via sitecustomize) but doing nothing in this process"], result


def test_debug_lines_carry_pid_and_rank():
    result = python("import autoteardown.log as log; log.debug('hello')", shim=True,
                    env={"AUTOTEARDOWN_DEBUG": 1, "RANK": 3}, timeout=60)
    assert re.search(r"^autoteardown: \[pid \d+ rank 3\] DEBUG: hello$", result.stderr, re.M), result
    result = python("import autoteardown.log as log; log.warning('plain')", shim=True, timeout=60)
    assert result.stderr.strip() == "autoteardown: WARNING: plain", result


def test_warning_once_is_keyed_by_the_formatted_message():
    code = ("import autoteardown.log as log\n"
            "for value in (1, 2, 1, 2):\n    log.warning_once('value %s', value)")
    result = python(code, shim=False, pythonpath=ROOT, timeout=60)
    assert result.stderr.splitlines() == ["autoteardown: WARNING: value 1", "autoteardown: WARNING: value 2"], result


@pytest.mark.needs_torch
def test_a_config_warning_is_printed_once_per_process_tree(jobs):
    # A spawn DataLoader: the script, its 2 workers and multiprocessing's resource tracker all
    # read the same bad value; only the first says so. A child with another value still warns.
    result = jobs.run("cli_dataloader_wandb.py", "spawn", AUTOTEARDOWN_TIMEOUT="soon")
    assert result.returncode == 0, result
    warnings = [line for line in result.stderr.splitlines() if "AUTOTEARDOWN_TIMEOUT" in line]
    assert warnings == ["autoteardown: WARNING: AUTOTEARDOWN_TIMEOUT='soon' is not a positive number of "
                        "seconds; using 10"], result
    code = ("import os, subprocess, sys; os.environ['AUTOTEARDOWN_TIMEOUT'] = 'later'; "
            "subprocess.run([sys.executable, '-c', 'pass'])")
    result = python(code, shim=True, env={"AUTOTEARDOWN_TIMEOUT": "soon"}, timeout=60)
    assert result.stderr.count("is not a positive number") == 2, result
