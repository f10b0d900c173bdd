"""Each way of turning autoteardown on, with an unmodified script in a subprocess."""

import os
import shutil
import signal
import subprocess
import sys

from helpers import ROOT, SCRIPTS, base_env, noise, tracebacks, wait_gone

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


def test_import_in_the_script():
    env = base_env(shim=False, PYTHONPATH=str(ROOT))
    code = "import autoteardown\n" + RUN_JOB
    assert_clean(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=90))


def test_sitecustomize_runs_the_one_it_shadows(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('SHADOWED SITECUSTOMIZE RAN')\n")
    env = base_env(shim=True)
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    result = subprocess.run([sys.executable, "-c", "import sys; print('AT', 'autoteardown' in sys.modules)"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines() == ["SHADOWED SITECUSTOMIZE RAN", "AT True"], result


def test_pythonstartup_in_an_interactive_session():
    env = base_env(shim=False, PYTHONPATH=str(ROOT),
                   PYTHONSTARTUP=str(ROOT / "sitecustomize_example" / "pythonstartup.py"))
    result = subprocess.run([sys.executable, "-i"], input=RUN_JOB + "\n", env=env,
                            capture_output=True, text=True, timeout=90)
    assert_clean(result)
    # Without it the same session prints the DataLoader message.
    del env["PYTHONSTARTUP"]
    result = subprocess.run([sys.executable, "-i"], input=RUN_JOB + "\n", env=env,
                            capture_output=True, text=True, timeout=90)
    assert "killed by signal" in result.stderr


def test_autoteardown_run_covers_the_script_and_its_python_children():
    env = base_env(shim=False)
    result = subprocess.run([autoteardown_run(), sys.executable, JOB, "normal"], env=env,
                            capture_output=True, text=True, timeout=90)
    assert_clean(result)
    result = subprocess.run([autoteardown_run(), sys.executable, "-c", CHILD_SEES_SHIM], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "CHILD True", result


def test_autoteardown_run_passes_the_exit_status_through():
    env = base_env(shim=False)
    for code, status in [("pass", 0), ("import sys; sys.exit(3)", 3),
                         ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM)]:
        result = subprocess.run([autoteardown_run(), sys.executable, "-c", code], env=env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == status, (code, result)


def test_autoteardown_run_keeps_the_existing_pythonpath(tmp_path):
    (tmp_path / "marker_module.py").write_text("")
    env = base_env(shim=False, PYTHONPATH=str(tmp_path))
    result = subprocess.run([autoteardown_run(), sys.executable, "-c", "import marker_module, autoteardown"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
