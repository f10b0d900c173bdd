"""Suite-wide scaffolding: the `baseline` and `needs_torch` markers, the `jobs` fixture.

Baselines: a test marked `@pytest.mark.baseline` asserts that a symptom shows WITHOUT the
shim (it proves the scenario is real). Upstream timing, or an upstream fix, decides whether
it does, so such a test never fails the run: it runs as a non-strict xfail, and the terminal
summary lists each one as "shows symptom" (it passed) or "did not show" (it failed). Set
TESTS_BASELINE_REPORT=FILE to also append those lines to FILE (.ci/run collects them).

The pytest process itself is never armed: AUTOTEARDOWN_DISABLE is set before anything
imports autoteardown (importing wandb_records imports wandb; importing autoteardown would
patch it in-process). Subprocesses get their env from helpers.base_env, which drops every
AUTOTEARDOWN_* variable.
"""

import os
import signal
import sys

os.environ["AUTOTEARDOWN_DISABLE"] = "1"
# A suite started in the background (`.ci/run &` from a script) inherits SIGINT ignored, and
# so would every script it starts: Python then never raises KeyboardInterrupt, and the Ctrl-C
# tests would test nothing. The scripts get SIGINT as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Before anything imports ray: Ray reads it once, and on Linux its default puts the nodes
# this process starts (ray.cluster_utils) on the machine's network address, not loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
sys.path.insert(0, os.path.dirname(__file__))  # `from helpers import ...` in every test file

import pytest  # noqa: E402

from helpers import Jobs, remove_ray_tmpdir  # noqa: E402

SHOWS, DID_NOT_SHOW = "shows symptom", "did not show"
_config = None


def _why(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    message = (getattr(crash, "message", None) or str(report.longrepr)).strip().splitlines()
    return (message[0] if message else "?")[:100]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "baseline: shows a symptom WITHOUT the shim; its outcome is reported, never gating")
    config.addinivalue_line("markers", "needs_torch: skipped where torch is not installed")
    global _config
    _config = config
    config._baselines = {}


def _torch_missing():
    try:
        import importlib.util

        return importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):
        return True


def pytest_collection_modifyitems(config, items):
    no_torch = None
    for item in items:
        if item.get_closest_marker("baseline"):
            item.add_marker(pytest.mark.xfail(strict=False, reason="baseline (reported, not gating)"))
        if item.get_closest_marker("needs_torch"):
            if no_torch is None:
                no_torch = _torch_missing()
            if no_torch:
                item.add_marker(pytest.mark.skip(reason="needs torch"))


# Where torch is missing (the no-torch CI legs), a test module that cannot be imported
# for want of torch's world is skipped, not a collection error; with torch installed
# (the main leg) such an ImportError still fails.
TORCH_WORLD = ("torch", "torchdata", "ray.train", "lightning", "tensorboard")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.failed and isinstance(collector, pytest.Module) and _torch_missing():
        text = str(report.longrepr)
        if "ImportError" in text and any(f"'{name}" in text or f" {name}" in text for name in TORCH_WORLD):
            last = [line for line in text.splitlines() if line.startswith("E ")][-1:] or ["ImportError"]
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), 0, f"needs torch: {last[0][1:].strip()[:120]}")


def pytest_runtest_logreport(report):
    # A baseline's outcome is that of its first phase that is not a pass (setup or call),
    # else its call phase.
    if "baseline" not in report.keywords:
        return
    baselines = _config._baselines if _config else {}
    if report.nodeid in baselines and baselines[report.nodeid] != SHOWS:
        return
    if hasattr(report, "wasxfail"):
        outcome = SHOWS if report.passed else DID_NOT_SHOW
        if report.skipped:  # why not: an absent symptom, or a broken test?
            outcome += f" ({_why(report)})"
    elif report.skipped:
        outcome = "skipped"
    elif report.failed:
        outcome = "error"  # a failure outside xfail's reach (e.g. teardown)
    elif report.when == "call":
        outcome = SHOWS
    else:
        return
    if report.when == "teardown" and outcome == SHOWS:
        return
    baselines[report.nodeid] = outcome


def pytest_unconfigure(config):
    remove_ray_tmpdir()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    baselines = getattr(config, "_baselines", {})
    if not baselines or hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return
    terminalreporter.section("baselines (reported, not gating)")
    lines = []
    for nodeid, outcome in sorted(baselines.items()):
        head, _, why = outcome.partition(" (")
        lines.append(f"{head:14} {nodeid}" + (f"  ({why}" if why else ""))
    for line in lines:
        terminalreporter.write_line(line)
    shown = sum(o == SHOWS for o in baselines.values())
    terminalreporter.write_line(f"{shown} of {len(baselines)} baselines show their symptom")
    path = os.environ.get("TESTS_BASELINE_REPORT")
    if path:
        with open(path, "a") as out:
            out.write("".join(line + "\n" for line in lines))


@pytest.fixture
def jobs(tmp_path):
    """A helpers.Jobs in tmp_path; what its scripts left behind is killed by pid afterwards."""
    jobs = Jobs(tmp_path)
    try:
        yield jobs
    finally:
        jobs.cleanup()
