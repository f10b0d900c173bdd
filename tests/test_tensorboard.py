"""SummaryWriters never closed by the script: flushed and closed at exit."""

import importlib.util

import pytest

pytestmark = pytest.mark.needs_torch
pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from helpers import noise, python, run, tracebacks  # noqa: E402

BACKENDS = ["torch", pytest.param("tensorboardX", marks=pytest.mark.skipif(
    importlib.util.find_spec("tensorboardX") is None, reason="tensorboardX is not installed"))]


def scalars_kept(logdir):
    events = EventAccumulator(str(logdir))
    events.Reload()
    return len(events.Scalars("loss")) if "loss" in events.Tags()["scalars"] else 0


def job(logdir, mode="open", backend="torch", shim=True, env=None):
    args = [logdir, mode] + ([backend] if backend != "torch" else [])
    return run("tensorboard_job.py", *args, shim=shim, env=env, timeout=60)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_scalar_reaches_the_event_file(tmp_path, backend):
    result = job(tmp_path, backend=backend)
    assert result.returncode == 0, result
    assert "AT EXIT: closed=True" in result.stdout, result
    assert scalars_kept(tmp_path) == 100
    assert noise(result.stderr) == [] and tracebacks(result.stderr) == 0, result


@pytest.mark.baseline
def test_without_the_shim_the_last_scalars_are_lost(tmp_path):
    # What is lost is what the writer thread has not written when the interpreter
    # stops it: 89 to 100 of 100 measured here, and all 100 in 2 to 5 runs of 20,
    # so the job is run until one loses scalars (closed=False is certain every time).
    kept = []
    for attempt in range(3):
        logdir = tmp_path / str(attempt)
        result = job(logdir, shim=False)
        assert result.returncode == 0, result
        assert "AT EXIT: closed=False" in result.stdout, result
        kept.append(scalars_kept(logdir))
        if kept[-1] < 100:
            break
    assert min(kept) < 100, f"scalars kept in each run: {kept}"


def test_a_writer_the_script_closed_is_closed_once(tmp_path):
    result = job(tmp_path, mode="closed")
    assert result.returncode == 0 and result.stderr == "", result
    assert "AT EXIT: closed=True" in result.stdout, result
    assert scalars_kept(tmp_path) == 100


def test_can_be_disabled(tmp_path):
    result = job(tmp_path, env={"AUTOTEARDOWN_DISABLED_INTEGRATIONS": "tensorboard"})
    assert result.returncode == 0 and result.stderr == "", result
    assert "AT EXIT: closed=False" in result.stdout, result


CONTRACT = """
import sys, autoteardown, torch
assert "autoteardown.integrations.tensorboard" not in sys.modules
assert not [m for m in sys.modules if m.startswith(("tensorboard", "torch.utils.tensorboard"))]

import tensorboard
from torch.utils.tensorboard import SummaryWriter
from autoteardown import integrations
from autoteardown.integrations import unsupported_reason
import wrapt
assert "autoteardown.integrations.tensorboard" in sys.modules  # imported with its library
original = SummaryWriter.__init__.__wrapped__
assert not isinstance(original, wrapt.FunctionWrapper)
integrations.instrument("tensorboard")
assert SummaryWriter.__init__.__wrapped__ is original  # wrapped once
assert integrations.get_version("tensorboard") == tensorboard.__version__
assert unsupported_reason("tensorboard") is None

writer = SummaryWriter(log_dir=sys.argv[1])
assert autoteardown.live() == {"tensorboard": [writer]}
autoteardown.finalize()
assert writer.all_writers is None and autoteardown.live() == {}

integrations.uninstrument("tensorboard")
assert SummaryWriter.__init__ is original
SummaryWriter(log_dir=sys.argv[1])
assert autoteardown.live() == {}
print("OK")
"""


def test_contract_and_laziness(tmp_path):
    result = python(CONTRACT, tmp_path, timeout=60)
    assert result.returncode == 0 and result.stdout == "OK\n", result.stderr
    assert result.stderr == ""
