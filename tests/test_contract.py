"""The patch contract of every integration (as ddtrace's PatchTestCase), generated from
integrations.TABLE so that a new integration is covered the day it is declared.

Each case runs in a fresh interpreter: the library imported before or after autoteardown,
then the gate's instrument() twice, uninstrument(), instrument() again, autoteardown reloaded
and installed again, autoteardown.uninstall(). After each step every attribute the integration
wrapped is wrapped exactly once (never a wrapper of our wrapper), and after uninstrument()/uninstall()
every one of them is the very original object again and no hook of its `later` triggers is left.
The modules imported are its triggers and its `later` ones (Ray Tune's, Ray Train's). What
was wrapped is found by scanning the library's modules and classes for wrappers whose wrapper
function lives in the integration's module, so nothing it wraps can escape the check. A `later`
trigger imported after uninstrument() is wrapped by nothing (test_a_later_trigger_...).
"""

import importlib.util
import json
import subprocess
import sys

import pytest

from helpers import ROOT, base_env

from autoteardown.integrations import TABLE

# What each integration must at least wrap (the scan finds everything; this checks the scan).
EXPECTED = {
    "torch": {"torch.utils.data.dataloader.DataLoader._get_iterator",
              "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader._get_iterator"},
    "distributed": {"torch.distributed.init_process_group", "torch.distributed.new_group",
                    "torch.distributed.distributed_c10d.init_process_group",
                    "torch.distributed.distributed_c10d.new_group"},
    "checkpoint": {"torch.distributed.checkpoint.async_save",
                   "torch.distributed.checkpoint.state_dict_saver.async_save"},
    "tensorboard": {"torch.utils.tensorboard.writer.SummaryWriter.__init__"},
    "wandb": {"wandb.init", "wandb.sdk.init", "wandb.sdk.wandb_init.init", "wandb.sdk.wandb_run.Run.__exit__"},
    "mlflow": {"mlflow.tracking.fluent.ActiveRun.__exit__"},
    "ray": {"ray.actor.ActorHandle._actor_method_call", "ray.actor.ActorClass._remote", "ray.actor.exit_actor",
            "ray.shutdown"},
    "swanlab": {"swanlab.sdk.internal.run.Run.__init__", "swanlab.sdk.internal.run.Run.finish"},
    "trackio": {"trackio.run.Run.__init__", "trackio.run.Run.finish"},
    "comet": {"comet_ml.experiment.CometExperiment.__init__", "comet_ml.experiment.CometExperiment.end"},
    "aim": {"aim.sdk.run.Run.__init__", "aim.sdk.run.BasicRun.close"},
    "clearml": {"clearml.task.Task.init"},
}

CONTRACT = r"""
import importlib, json, sys, types
import wrapt

NAME, ORDER, MODULES = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
OURS = "autoteardown.integrations." + NAME
PREFIXES = sorted({m.split(".")[0] for m in MODULES})
WRAPPERS = wrapt.FunctionWrapper.__mro__[1]  # _FunctionWrapperBase: FunctionWrapper and its bound form


def imports():
    # Only what imports here (torch.utils.tensorboard needs tensorboard installed).
    global MODULES
    imported = []
    for module in MODULES:
        try:
            importlib.import_module(module)
            imported.append(module)
        except ImportError:
            pass
    MODULES = imported
    if not imported:
        print("SKIP: none of them imports here")
        sys.exit(0)


def is_ours(value):
    # type(), not isinstance(): isinstance() would ask lazy proxies for __class__.
    if not issubclass(type(value), WRAPPERS):
        return False
    wrapper = getattr(value, "_self_wrapper", None)
    module = getattr(wrapper, "__module__", None) or ""
    # ray_driver.py etc. count as ray's; a wrapper shared by integrations lives in the package
    # or, for a run's __exit__ in our unwind, in signals.py.
    return module in (OURS, "autoteardown.integrations", "autoteardown.signals") or module.startswith(OURS + "_")


def scan():
    # {"module.attr" or "module.Class.attr": (owner, attr, value)} for every wrapper of ours.
    found = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.split(".")[0] not in PREFIXES:
            continue
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for name, value in items:
            if is_ours(value):
                found[f"{module_name}.{name}"] = (module, name, value)
            elif type(value) is type or issubclass(type(value), type):
                if getattr(value, "__module__", None) != module_name:
                    continue  # a class is scanned where it is defined
                for attr, member in list(vars(value).items()):
                    if is_ours(member):
                        found[f"{module_name}.{value.__qualname__}.{attr}"] = (value, attr, member)
    return found


def wrapped_once():
    # {key: original} of what is wrapped now; each wrapped exactly once.
    originals = {}
    for key, (owner, attr, wrapper) in scan().items():
        inner = wrapper.__wrapped__
        assert not is_ours(inner), f"{key} is wrapped twice"
        originals[key] = (owner, attr, inner)
    return originals


def same(a, b):
    return {k: v[2] for k, v in a.items()} == {k: v[2] for k, v in b.items()} and all(
        a[k][2] is b[k][2] for k in a)


def later_hooks():
    from autoteardown import importhook

    return sorted(m for m in integrations.TABLE[NAME].later if importhook._state.hooks.get(m))


def restored(originals, step):
    assert scan() == {}, f"{step}: still wrapped: {sorted(scan())}"
    for key, (owner, attr, original) in originals.items():
        assert vars(owner).get(attr) is original, f"{step}: {key} is not the original again"


if ORDER == "before":
    imports()
    assert scan() == {}, "wrapped before autoteardown was imported"
import autoteardown
if ORDER == "after":
    assert OURS not in sys.modules, "the integration was imported before its library"
    imports()
from autoteardown import integrations
assert OURS in sys.modules

first = wrapped_once()
assert first, "nothing wrapped"
integrations.instrument(NAME)
integrations.instrument(NAME)
assert same(wrapped_once(), first), "instrument() twice changed what is wrapped"
LATER = sorted(integrations.TABLE[NAME].later)
assert later_hooks() == LATER, f"the later triggers' hooks: {later_hooks()}"
integrations.uninstrument(NAME)
restored(first, "uninstrument()")
assert later_hooks() == [], f"uninstrument() left hooks: {later_hooks()}"
integrations.instrument(NAME)
assert same(wrapped_once(), first), "instrument() after uninstrument() differs"
importlib.reload(autoteardown)
autoteardown.install()
assert same(wrapped_once(), first), "reload and install() changed what is wrapped"
autoteardown.uninstall()
restored(first, "uninstall()")
assert later_hooks() == [], f"uninstall() left hooks: {later_hooks()}"
print("WRAPPED:", json.dumps(sorted(first)))
print("IMPORTED:", json.dumps(MODULES))
"""


def modules_of(name):
    """The integration's trigger modules, then its `later` ones, whose top-level package is installed."""
    return [m for m in (*TABLE[name].triggers, *TABLE[name].later)
            if importlib.util.find_spec(m.split(".")[0]) is not None]


def cases():
    return [pytest.param(name, order, id=f"{name}-imported-{order}")
            for name in TABLE for order in ("before", "after")]


@pytest.mark.parametrize("name, order", cases())
def test_patch_contract(name, order):
    if importlib.util.find_spec(f"autoteardown.integrations.{name}") is None:
        pytest.skip(f"autoteardown.integrations.{name} does not exist yet")
    modules = modules_of(name)
    if not modules:
        pytest.skip(f"none of {TABLE[name].triggers} is installed")
    result = subprocess.run([sys.executable, "-c", CONTRACT, name, order, json.dumps(modules)],
                            env=base_env(False, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    if result.stdout.startswith("SKIP:"):
        pytest.skip(f"none of {modules} imports here")
    wrapped = set(json.loads(result.stdout.split("WRAPPED:")[1].split("\n")[0]))
    imported = json.loads(result.stdout.split("IMPORTED:")[1])
    # The expected names of the packages imported (tensorboardX's when it is installed).
    expected = {key for key in EXPECTED.get(name, ()) if any(key.startswith(m + ".") or key.startswith(
        m.split(".")[0] + ".") for m in imported)}
    assert expected <= wrapped, (sorted(expected - wrapped), sorted(wrapped))
    assert "autoteardown" not in result.stderr, result.stderr  # no warning, no failure logged


LATER_AFTER_UNINSTRUMENT = r"""
import importlib, json, sys
import wrapt
import autoteardown
from autoteardown import importhook, integrations

NAME, TRIGGERS, LATER = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
WRAPPERS = wrapt.FunctionWrapper.__mro__[1]
for module in TRIGGERS:
    importlib.import_module(module)
integrations.uninstrument(NAME)
assert not any(importhook._state.hooks.get(m) for m in LATER), importhook._state.hooks
imported = []
for module in LATER:
    try:
        imported.append(importlib.import_module(module))
    except ImportError:
        pass
members = [(m.__name__, k, v) for m in imported for k, v in vars(m).items()]
members += [(f"{m.__name__}.{k}", a, w) for m in imported for k, v in vars(m).items() if isinstance(v, type)
            for a, w in vars(v).items()]
OURS = "autoteardown.integrations." + NAME  # ray_tune.py etc. count as ray's (another's, wandb's, not)
owner = lambda value: getattr(getattr(value, "_self_wrapper", None), "__module__", "") or ""  # noqa: E731
ours = [f"{where}.{attr}" for where, attr, value in members if issubclass(type(value), WRAPPERS)
        and (owner(value) == OURS or owner(value).startswith(OURS + "_"))]
assert ours == [], ours
autoteardown.uninstall()
print("LATER:", len(imported))
"""


@pytest.mark.parametrize("name", [name for name in TABLE if TABLE[name].later])
def test_a_later_trigger_imported_after_uninstrument_is_wrapped_by_nothing(name):
    later = [m for m in TABLE[name].later if m.split(".")[0] in {t.split(".")[0] for t in modules_of(name)}]
    if not later:
        pytest.skip(f"none of {TABLE[name].triggers} is installed")
    result = subprocess.run([sys.executable, "-c", LATER_AFTER_UNINSTRUMENT, name, json.dumps(TABLE[name].triggers),
                             json.dumps(later)], env=base_env(False, PYTHONPATH=ROOT), capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr
    assert "LATER:" in result.stdout and "autoteardown" not in result.stderr, result
