"""The pure logic, fast: version_tuple, the Ray runtime_env hook's dict (in this process);
the exit engine through its calls ending() and finalize(), each in a fresh
interpreter with no library but autoteardown (the pytest process is never armed)."""

import json

import pytest

from helpers import ROOT, python

from autoteardown.integrations import check_version, version_tuple

# ---- recording(): what a record hook records, and that it never raises ----------

def test_recording_records_a_result_or_an_initialised_instance_and_never_raises():
    import wrapt

    from autoteardown.integrations import recording

    seen = []

    def record(obj):
        seen.append(obj)
        raise RuntimeError("a record that fails")  # a debug line, never the caller's

    class Made:
        def __init__(self, value):
            self.value = value

        def make(self):
            return ("made by", self.value)

    wrapt.wrap_function_wrapper(Made, "__init__", recording(record))
    wrapt.wrap_function_wrapper(Made, "make", recording(record))
    made = Made(3)
    assert made.value == 3 and seen == [made]
    assert made.make() == ("made by", 3) and seen == [made, ("made by", 3)]
    assert recording(record).__module__ == __name__  # the recording module's wrapper (unpatch, contract scan)


# ---- OneEndAtATime: a tracker's ends, one at a time -----------------------------

def test_an_end_under_way_is_waited_for_and_not_run_again():
    """comet's end(), aim's close(), swanlab's and trackio's finish(): the program's end runs in
    one thread; a finalize_one in another holds the object's lock, so it waits, then finds it ended."""
    import threading
    import time

    import wrapt

    from autoteardown.integrations import OneEndAtATime

    ends, started = OneEndAtATime(), threading.Event()

    class Run:
        def __init__(self):
            self.alive, self.calls = True, 0

        def end(self):
            self.calls += 1
            started.set()
            time.sleep(0.3)  # the end's work (an upload); alive turns False at its end, as comet's
            self.alive = False

    wrapt.wrap_function_wrapper(Run, "end", ends)
    run, other = Run(), Run()

    def finalize_one(obj):
        with ends.held(obj):
            if obj.alive:
                obj.end()

    program = threading.Thread(target=run.end)
    program.start()
    assert started.wait(5)
    finalize_one(run)  # while the program's end runs
    program.join(5)
    assert run.calls == 1 and not run.alive
    finalize_one(other)  # one nobody ended: ended once, re-entrantly under its own lock
    assert other.calls == 1 and not other.alive
    assert ends.held(object.__new__(type("Slotted", (), {"__slots__": ()}))) is not None  # no weak ref: no lock


# ---- version_tuple, check_version ---------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("2.13.0", (2, 13, 0)),
    ("2.13.0+cpu", (2, 13, 0)),
    ("0.22", (0, 22)),
    ("2.40.0rc1", (2, 40, 0)),
    ("1.0.0.dev20240101", (1, 0, 0)),
    ("2.0a1", (2, 0)),
    ("", ()),
    ("nightly", ()),
])
def test_version_tuple(text, expected):
    assert version_tuple(text) == expected


def test_version_ranges_compare_release_numbers():
    assert version_tuple("0.22.0") >= version_tuple("0.22")
    assert version_tuple("0.31.9") < version_tuple("0.32")
    assert version_tuple("2.100.0") > version_tuple("2.40")  # numbers, not strings
    assert version_tuple("10.0") > version_tuple("9.9")


def test_check_version_of_something_not_installed_is_fine():
    assert check_version("no-such-distribution-autoteardown", "1.0") is None


def test_check_version_outside_the_range_says_why(tmp_path, monkeypatch):
    info = tmp_path / "fakelib-0.5.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakelib\nVersion: 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check_version("fakelib", "0.5", "0.6") is None
    assert check_version("fakelib", "1.0") == "fakelib 0.5 is not supported (need >=1.0)"
    assert check_version("fakelib", "0.1", "0.5") == "fakelib 0.5 is not supported (need >=0.1,<0.5)"


# ---- the Ray runtime_env hook -------------------------------------------------

PACKAGE = str(ROOT / "autoteardown")


def hook(runtime_env):
    from autoteardown.integrations.ray import runtime_env_hook

    return runtime_env_hook(runtime_env)


@pytest.fixture
def clean_hook_env(monkeypatch):
    monkeypatch.delenv("AUTOTEARDOWN_NEXT_RUNTIME_ENV_HOOK", raising=False)


def test_runtime_env_hook_ships_and_installs_autoteardown(clean_hook_env):
    shipped = hook(None)
    assert sorted(shipped) == ["py_modules", "worker_process_setup_hook"], shipped
    assert shipped["py_modules"][0] == PACKAGE, shipped  # and what it needs (wrapt), if anything
    assert shipped["worker_process_setup_hook"] == "autoteardown.install"


def test_runtime_env_hook_keeps_what_is_there_and_is_idempotent(clean_hook_env):
    given = {"py_modules": ["/some/module"], "env_vars": {"A": "1"}, "pip": ["x"]}
    once = hook(given)
    assert given == {"py_modules": ["/some/module"], "env_vars": {"A": "1"}, "pip": ["x"]}  # not mutated
    assert once["py_modules"][:2] == ["/some/module", PACKAGE], once
    assert once["env_vars"] == {"A": "1"} and once["pip"] == ["x"]
    assert hook(once) == once


def test_runtime_env_hook_chains_the_users_setup_hook(clean_hook_env, monkeypatch):
    chained = hook({"worker_process_setup_hook": "mypkg.setup", "env_vars": {"A": "1"}})
    assert chained["env_vars"] == {"A": "1", "AUTOTEARDOWN_NEXT_SETUP_HOOK": "mypkg.setup"}
    assert chained["worker_process_setup_hook"] == "autoteardown.integrations.ray.setup_hook"
    assert hook(chained) == chained  # applied twice: still chained once

    # A callable hook is wrapped: the worker installs autoteardown, then runs the user's.
    import autoteardown

    calls = []
    monkeypatch.setattr(autoteardown, "install", lambda: calls.append("install"))  # not in this process
    wrapped = hook({"worker_process_setup_hook": lambda: calls.append("user")})["worker_process_setup_hook"]
    assert callable(wrapped) and calls == []
    wrapped()
    assert calls == ["install", "user"]


def next_hook(runtime_env):
    """An AUTOTEARDOWN_NEXT_RUNTIME_ENV_HOOK for the test below."""
    return {**runtime_env, "env_vars": {"NEXT": "ran"}}


def test_runtime_env_hook_runs_the_next_hook_first(monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("AUTOTEARDOWN_NEXT_RUNTIME_ENV_HOOK", "test_units.next_hook")
    result = hook({"pip": ["x"]})
    assert result["env_vars"] == {"NEXT": "ran"} and result["pip"] == ["x"]
    assert result["worker_process_setup_hook"] == "autoteardown.install"


NO_ITERATOR = """
import autoteardown
import torch.utils.data as data
del data.DataLoader._get_iterator  # a torch without it (torch has no upper bound in TABLE)
from autoteardown import integrations
integrations.uninstrument("torch")
integrations.instrument("torch")
print("WRAPPED:", type(vars(data.DataLoader).get("_get_iterator")).__name__)
"""


def test_a_dataloader_without_get_iterator_gets_one_warning_and_is_left_alone():
    pytest.importorskip("torch")
    result = python(NO_ITERATOR, shim=False, pythonpath=ROOT, timeout=120)
    assert result.returncode == 0 and "WRAPPED: NoneType" in result.stdout, result
    assert result.stderr.count("has no _get_iterator (unsupported version)") == 1, result


# ---- the exit engine: ending() and finalize(), in a fresh interpreter ----------

PROBE = """
import json, os, signal, sys, threading, time
from autoteardown import engine, exitstatus, registry, signals

class Probe:
    pass

seen = []

def finalize_one(obj, timeout):
    code, exc, _ = exitstatus.ending()
    seen.append(code)
    signum = (signals.received() or (None,))[0]
    print("SEEN:", json.dumps([code, type(exc).__name__ if exc else None, signum]), flush=True)

engine.register_kind("probe", 0, finalize_one)
probe = Probe()
registry.record("probe", probe)
engine.arm()
ENDING
"""

ENDINGS = {  # ending: (code, exception, signal) seen by a finalizer at exit
    "pass": (0, None, None),
    "sys.exit(3)": (3, None, None),
    "sys.exit(0)": (0, None, None),
    "sys.exit('message')": (1, None, None),
    "raise ValueError('x')": (1, "ValueError", None),
    "raise KeyboardInterrupt": (None, "KeyboardInterrupt", None),  # the code is the integrations' call
    "os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)": (143, None, 15),
    # sys.exit() in another thread ends that thread only: the process code is unchanged.
    "t = threading.Thread(target=sys.exit, args=(4,)); t.start(); t.join(); sys.exit(5)": (5, None, None),
    # An override wins over what the process shows, during that call only.
    "engine.finalize(exit_code=7); registry.record('probe', probe); sys.exit(2)": (7, None, None),
}


def probe(ending, timeout=30):
    result = python(PROBE.replace("ENDING", ending), shim=False, pythonpath=ROOT, timeout=timeout)
    seen = [json.loads(line.split(":", 1)[1]) for line in result.stdout.splitlines() if line.startswith("SEEN:")]
    return result, seen


@pytest.mark.parametrize("ending", ENDINGS)
def test_exit_code_seen_by_a_finalizer(ending):
    code, exception, signum = ENDINGS[ending]
    result, seen = probe(ending)
    assert seen, result
    first = seen[0]
    if code is not None:
        assert first[0] == code, (ending, result)
    assert first[1] == exception and first[2] == signum, (ending, result)
    if ending.startswith("engine.finalize"):  # and the exit itself sees the process's own code again
        assert [s[0] for s in seen] == [7, 2], result


def test_finalize_is_safe_to_call_twice_and_forgets_what_it_finalized():
    result, seen = probe("engine.finalize(); engine.finalize(); print('LIVE:', len(registry.live()))")
    assert len(seen) == 1 and "LIVE: 0" in result.stdout, result


STEPS = """
import sys, time
from autoteardown import engine, registry

class Step:
    def __init__(self, name, hang):
        self.name, self.hang = name, hang

budgets = {}

def finalize_one(step, timeout):
    budgets[step.name] = timeout
    if step.hang:
        time.sleep(3600)

engine.register_kind("step", 0, finalize_one)
steps = [Step(name, name == HANG) for name in ("a", "b", "c")]
for step in steps:
    registry.record("step", step)
began = time.monotonic()
engine.finalize(timeout=TIMEOUT)
print("ELAPSED:", time.monotonic() - began)
print("BUDGETS:", *[round(budgets.get(name, -1), 2) for name in "abc"], flush=True)
"""


@pytest.mark.parametrize("hang", ["none", "a"])
def test_a_hung_step_cannot_starve_the_steps_after_it(hang):
    # Each step may take all the time left but about a second for each step after it
    # (never less than its fair share): the budgets say so, and a hung first step
    # leaves the others their time. Bounds from the timeout, plus a margin for load.
    timeout = 4.0
    code = STEPS.replace("HANG", repr(hang)).replace("TIMEOUT", repr(timeout))
    result = python(code, shim=False, pythonpath=ROOT, timeout=timeout + 60)
    assert result.returncode == 0, result
    elapsed = float(result.stdout.split("ELAPSED:")[1].split()[0])
    budgets = [float(b) for b in result.stdout.split("BUDGETS:")[1].split()]
    assert all(b > 0 for b in budgets), result  # every step ran
    assert budgets[0] <= timeout and budgets[0] >= timeout / 3, result
    assert budgets[0] < budgets[2] or hang == "a", result  # later steps keep a reserve
    if hang == "a":
        assert elapsed < timeout + 1.0, result  # the deadline holds
        assert budgets[0] <= timeout - 1.0, result  # a reserve of at least a second for the others
    else:
        assert elapsed < timeout, result
