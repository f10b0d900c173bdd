"""The registry, the import hooks, config and idempotency (in fresh interpreters
where import order matters; the patch contract of each integration is in test_contract.py)."""

import gc

import pytest

from helpers import ROOT, python

from autoteardown import registry

HEAVY = ("torch", "torchdata", "wandb", "ray", "wrapt", "mlflow", "swanlab", "trackio")


def test_import_is_lazy():
    result = python("import sys, autoteardown; print([m for m in %r if m in sys.modules])" % (HEAVY,), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert result.stderr == ""


class Thing:
    pass


def test_registry_holds_weak_references():
    thing = Thing()
    registry.record("test", thing)
    assert registry.live("test") == [thing]
    del thing
    gc.collect()
    assert registry.live("test") == []


def test_registry_does_not_grow():
    for _ in range(10_000):
        registry.record("test", Thing())
    assert registry.size() < 200


CHURN = """
import collections, contextlib, sys, threading
from autoteardown import registry
if sys.argv[1] == "unlocked":
    registry._state.lock = contextlib.nullcontext()
sys.setswitchinterval(1e-6)  # a thread switch every few bytecodes: the races happen, if any

class Thing:
    pass

errors, kept = [], []

def churn():
    recent = collections.deque(maxlen=300)  # objects die a while after being recorded
    try:
        for i in range(30000):
            thing = Thing()
            recent.append(thing)
            registry.record("test", thing)  # and prunes the dead entries now and then
            if i % 100 == 0:
                kept.append(thing)
            elif i % 7 == 0:
                registry.forget(thing)
            if i % 50 == 0:
                registry.live("test")
    except Exception as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=churn) for _ in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
live = registry.live("test")
print("ERRORS:", errors[:1], "LOST:", len([k for k in kept if not any(k is o for o in live)]))
"""


def churn(lock):
    result = python(CHURN, lock, shim=False, pythonpath=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_registry_is_thread_safe():
    # Six threads record, forget, list and prune, with forced thread switches.
    assert churn("locked").strip() == "ERRORS: [] LOST: 0"


@pytest.mark.baseline
def test_without_its_lock_the_registry_breaks_under_the_same_churn():
    # Proves the test above can fail: "dictionary changed size during iteration" in the
    # prune, or a KeyError (10 of 10 runs here).
    assert "ERRORS: []" not in churn("unlocked")


def test_bad_config_warns_once_and_uses_defaults():
    result = python("import autoteardown.config as c; print(c.TIMEOUT, sorted(c.DISABLED_INTEGRATIONS), c.DEBUG)",
                    env={"AUTOTEARDOWN_TIMEOUT": "soon", "AUTOTEARDOWN_DISABLED_INTEGRATIONS": "wandb,tensorflow",
                         "AUTOTEARDOWN_DEBUG": "maybe"}, timeout=120)
    assert result.returncode == 0
    assert result.stdout.strip() == "10.0 ['wandb'] False"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, result.stderr
    assert all(line.startswith("autoteardown: WARNING:") for line in lines)


@pytest.mark.needs_torch
def test_disable_does_nothing_at_all():
    result = python("import autoteardown, sys, torch.utils.data as d, wrapt;"
                    "print(isinstance(vars(d.DataLoader)['_get_iterator'], wrapt.FunctionWrapper))",
                    env={"AUTOTEARDOWN_DISABLE": "1"}, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.needs_torch
def test_disabled_integration_is_not_patched():
    result = python("import autoteardown, torch.utils.data as d, wrapt;"
                    "print(isinstance(vars(d.DataLoader)['_get_iterator'], wrapt.FunctionWrapper))",
                    env={"AUTOTEARDOWN_DISABLED_INTEGRATIONS": "torch"}, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


STATE_AFTER_FINALIZE = """
import psutil, torch, autoteardown
from torchdata.stateful_dataloader import StatefulDataLoader
loader = StatefulDataLoader(list(range(100)), batch_size=2, num_workers=2)
batches = iter(loader)
for _ in range(5):
    next(batches)
before = loader.state_dict()
autoteardown.finalize()
assert psutil.Process().children() == [], psutil.Process().children()
after = loader.state_dict()
assert psutil.Process().children() == [], "state_dict() started workers"
assert after["_snapshot"]["_snapshot_step"] == before["_snapshot"]["_snapshot_step"] == 5, (before, after)
assert autoteardown.live() == {}
print("OK")
"""


@pytest.mark.needs_torch
def test_finalize_keeps_the_position_and_starts_no_workers():
    result = python(STATE_AFTER_FINALIZE, timeout=120)
    assert result.stdout.strip() == "OK", result.stderr


WAITS_FOR_MAIN = """
import multiprocessing, sys, threading, time
import autoteardown
from autoteardown import engine, registry

class Resource:
    pass

def finalize(obj, timeout):
    print("FINALIZED", "after" if WAITED else "before", "the waiting thread", flush=True)

WAITED = []

def waiter(how):
    if how == "join":
        threading.main_thread().join()
    else:
        while threading.main_thread().is_alive():
            time.sleep(0.01)
    WAITED.append(how)
    print("WAITED", how, flush=True)

def main(how):
    engine.register_kind("resource", 50, finalize)
    globals()["kept"] = Resource()
    registry.record("resource", kept)
    threading.Thread(target=waiter, args=(how,)).start()

if __name__ == "__main__":
    how, where = sys.argv[1:]
    if where == "child":
        child = multiprocessing.get_context("spawn").Process(target=main, args=(how,))
        child.start()
        child.join()
        print("CHILD", child.exitcode, flush=True)
    else:
        main(how)
"""


@pytest.mark.parametrize("where", ["main", "child"])
@pytest.mark.parametrize("how", ["join", "alive"])
def test_a_thread_waiting_for_the_main_thread_ends_before_the_teardown(tmp_path, how, where):
    # Python marks the main thread stopped, then joins the others; the teardown comes after.
    script = tmp_path / "waits.py"
    script.write_text(WAITS_FOR_MAIN)
    result = python([script, how, where], timeout=60)
    assert result.returncode == 0, result
    assert f"WAITED {how}" in result.stdout and "FINALIZED after the waiting thread" in result.stdout, result
    assert where == "main" or "CHILD 0" in result.stdout, result
