"""`autoteardown demo` and `doctor`, as a newcomer runs them (through python -m autoteardown)."""

import re

import pytest

from helpers import ROOT, python

WIDTH, COL = 42, 13  # demo.report's layout


def demo(*args, timeout=400):
    return python(["-m", "autoteardown", "demo", *args], shim=False, pythonpath=ROOT, timeout=timeout)


def rows(out):
    """{(job number, row title): (without, with)} of the table."""
    found, job = {}, None
    for line in out.splitlines():
        match = re.match(r"^(\d)\. ", line)
        if match:
            job = int(match.group(1))
        elif job and line.startswith("   ") and not line.startswith("   ("):
            found[(job, line[:WIDTH].strip())] = (line[WIDTH:WIDTH + COL].strip(), line[WIDTH + COL:].strip())
        elif not line.strip():
            job = None
    return found


@pytest.fixture(scope="module")
def full_demo():
    return demo()


@pytest.mark.needs_torch
def test_every_row_differs_and_the_shim_column_is_clean(full_demo):
    result = full_demo
    assert result.returncode == 0, result.stdout[-3000:]
    out = result.stdout
    assert "settings: WANDB_MODE=offline" in out and "AUTOTEARDOWN_RAY_GRACE_S=2" in out, out
    assert "Try it on your script:" in out and "autoteardown run python train.py" in out, out
    table = rows(out)
    assert table, out
    for title, (without, with_) in table.items():
        assert without != with_, (title, out)
    expected_with = {(1, '"killed by signal" printed'): "no", (1, "exit status"): "0",
                     (2, "wandb steps kept"): "10 of 10", (2, "wandb exit record"): "yes (143)",
                     (3, "wandb steps kept (logged in the actor)"): "10 of 10", (3, "DEAD actors still running"): "0"}
    for key, value in table.items():
        if key in expected_with:
            assert value[1] == expected_with[key], (key, out)
    from autoteardown.cli.demo import ROWS

    legend = out.split("what the rows mean:")[1].split("\n\n")[0]
    keys = {key for job in ROWS.values() for title, key, _ in job if any(t == title for _, t in table)}
    for key in keys:  # a legend line for every kind of row shown
        assert re.search(rf"^  {re.escape(key)}: \S", legend, re.M), (key, out)


@pytest.mark.needs_torch
@pytest.mark.baseline
def test_without_the_shim_every_symptom_shows(full_demo):
    table = rows(full_demo.stdout)
    assert table[(1, '"killed by signal" printed')] == ("yes", "no"), full_demo.stdout
    assert table[(2, "wandb steps kept")][0] == "0 of 10", full_demo.stdout
    assert table[(2, "wandb exit record")][0] == "missing", full_demo.stdout
    assert table[(3, "wandb steps kept (logged in the actor)")][0] == "0 of 10", full_demo.stdout
    assert table[(3, "DEAD actors still running")][0] == "1", full_demo.stdout


@pytest.mark.needs_torch
def test_a_failed_job_makes_the_demo_fail_with_its_stderr():
    result = demo("--only", "fork", "--fail-job", "fork", timeout=120)
    assert result.returncode == 1, result
    assert "[2/2] fork job with autoteardown ... " in result.stdout and "FAILED" in result.stdout, result
    assert "The fork job with autoteardown failed" in result.stdout, result
    assert "  | RuntimeError: failing on purpose (autoteardown demo --fail-job)" in result.stdout, result


def test_doctor_reports_versions_integrations_activation_and_config():
    result = python(["-m", "autoteardown", "doctor"], shim=False, pythonpath=ROOT, timeout=60,
                    env={"AUTOTEARDOWN_TIMEOUT": "later", "AUTOTEARDOWN_DISABLED_INTEGRATIONS": "wandb"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    import importlib.util

    for name in ("torch", "torchdata", "wandb", "ray", "psutil", "tensorboardX"):
        shown = r"\d" if importlib.util.find_spec(name) is not None else "not installed$"
        assert re.search(rf"^  {name}\s+" + shown, out, re.M), (name, out)
    assert re.search(r"^  wandb\s+disabled by config", out, re.M), out
    if importlib.util.find_spec("torch") is not None:
        assert re.search(r"^  torch\s+will patch when imported", out, re.M), out
    assert "active for `python` here: no" in out, out
    assert f"bootstrap sitecustomize: {ROOT / 'autoteardown' / 'bootstrap'}" in out, out
    assert "AUTOTEARDOWN_TIMEOUT = 10.0" in out
    assert result.stderr.count("AUTOTEARDOWN_TIMEOUT='later' is not a positive number") == 1, result.stderr
    result = python(["-m", "autoteardown", "doctor"], shim=True, timeout=60)
    assert "active for `python` here: yes, through sitecustomize" in result.stdout, result


def test_doctor_finds_the_psutil_ray_bundles():
    import importlib.util
    import os

    pytest.importorskip("ray")
    from autoteardown.cli import doctor

    folder = os.path.join(os.path.dirname(importlib.util.find_spec("ray").origin), "thirdparty_files")
    bundled = [n for n in os.listdir(folder) if n.startswith("psutil-") and n.endswith(".dist-info")]
    assert bundled and doctor._bundled_with_ray("psutil") == bundled[0][len("psutil-"):-len(".dist-info")]
