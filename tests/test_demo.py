"""`python -m autoteardown demo` and `doctor`, as a newcomer runs them."""

import re
import subprocess
import sys

from helpers import base_env


def row(report, title):
    match = re.search(rf"^{re.escape(title)}\s+(\S+(?: \(\S+\))?)\s+(\S+(?: \(\S+\))?)$", report, re.M)
    assert match, (title, report)
    return match.group(1), match.group(2)


def test_demo_shows_the_symptoms_without_the_shim_and_none_with_it():
    result = subprocess.run([sys.executable, "-m", "autoteardown", "demo"], env=base_env(shim=False),
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    report = result.stdout
    assert "[1/2] running the job without autoteardown" in report and "[2/2]" in report
    steps = re.search(r"^job of (\d+) logged steps", report, re.M).group(1)
    assert row(report, "wandb history steps kept") == ("0", steps)
    assert row(report, "wandb exit record (code)") == ("missing", "yes (0)")
    assert row(report, "zombie actors (DEAD, still running)") == ("1", "0")
    assert row(report, "exit status") == ("0", "0")
    assert row(report, "exit noise")[1] == "none"


def test_doctor_reports_versions_integrations_and_config():
    result = subprocess.run([sys.executable, "-m", "autoteardown", "doctor"],
                            env=base_env(shim=False, AUTOTEARDOWN_TIMEOUT="later",
                                         AUTOTEARDOWN_DISABLED_INTEGRATIONS="wandb"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for name in ("torch", "torchdata", "wandb", "ray"):
        assert re.search(rf"^  {name}\s+\d", out, re.M), out
    assert re.search(r"^  wandb\s+disabled by config", out, re.M), out
    assert re.search(r"^  torch\s+will patch when imported", out, re.M), out
    assert "AUTOTEARDOWN_TIMEOUT = 10.0" in out
    assert "AUTOTEARDOWN_TIMEOUT='later' is not a positive number" in result.stderr
