"""The registry, the import hooks, config and idempotency (in fresh interpreters
where import order matters)."""

import gc
import subprocess
import sys
import threading

from autoteardown import registry
from helpers import base_env

HEAVY = ("torch", "torchdata", "wandb", "ray", "wrapt")


def python(code, shim=True, timeout=120, **env):
    return subprocess.run([sys.executable, "-c", code], env=base_env(shim, **env),
                          capture_output=True, text=True, timeout=timeout)


def test_import_is_lazy():
    result = python("import sys, autoteardown; print([m for m in %r if m in sys.modules])" % (HEAVY,))
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


def test_registry_is_thread_safe():
    keep = []
    errors = []

    def churn():
        try:
            for i in range(2000):
                thing = Thing()
                registry.record("test", thing)
                if i % 10 == 0:
                    keep.append(thing)
                registry.live()
        except Exception as exc:  # pragma: no cover - the assertion reports it
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(registry.live("test")) == len(keep)
    for thing in keep:
        registry.forget(thing)


PATCHED_ONCE = """
import importlib, sys, wrapt
{before}
import autoteardown
import autoteardown
importlib.reload(autoteardown)
autoteardown.install(); autoteardown.install()
{after}
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
for cls in (DataLoader, StatefulDataLoader):
    method = vars(cls)["_get_iterator"]
    assert isinstance(method, wrapt.FunctionWrapper), cls
    assert not isinstance(method.__wrapped__, wrapt.FunctionWrapper), cls
autoteardown.uninstall()
for cls in (DataLoader, StatefulDataLoader):
    assert not isinstance(vars(cls)["_get_iterator"], wrapt.FunctionWrapper), cls
print("OK")
"""


def test_patches_once_whatever_the_import_order():
    for before, after in [("", "import torch, torchdata.stateful_dataloader"),
                          ("import torch, torchdata.stateful_dataloader", "")]:
        result = python(PATCHED_ONCE.format(before=before, after=after), shim=False)
        assert result.stdout.strip() == "OK", result.stderr


def test_bad_config_warns_once_and_uses_defaults():
    result = python("import autoteardown.config as c; print(c.TIMEOUT, sorted(c.DISABLED_INTEGRATIONS), c.DEBUG)",
                    AUTOTEARDOWN_TIMEOUT="soon", AUTOTEARDOWN_DISABLED_INTEGRATIONS="wandb,tensorflow",
                    AUTOTEARDOWN_DEBUG="maybe")
    assert result.returncode == 0
    assert result.stdout.strip() == "10.0 ['wandb'] False"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, result.stderr
    assert all(line.startswith("autoteardown: WARNING:") for line in lines)


def test_disable_does_nothing_at_all():
    result = python("import autoteardown, sys, torch.utils.data as d, wrapt;"
                    "print(isinstance(vars(d.DataLoader)['_get_iterator'], wrapt.FunctionWrapper))",
                    AUTOTEARDOWN_DISABLE="1")
    assert result.stdout.strip() == "False", result.stderr


def test_disabled_integration_is_not_patched():
    result = python("import autoteardown, torch.utils.data as d, wrapt;"
                    "print(isinstance(vars(d.DataLoader)['_get_iterator'], wrapt.FunctionWrapper))",
                    AUTOTEARDOWN_DISABLED_INTEGRATIONS="torch")
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


def test_finalize_keeps_the_position_and_starts_no_workers():
    result = python(STATE_AFTER_FINALIZE)
    assert result.stdout.strip() == "OK", result.stderr
