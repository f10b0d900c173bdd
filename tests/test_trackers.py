"""The gate, for every tracker integration run by tracker_job.py (swanlab, trackio, comet,
aim, clearml): AUTOTEARDOWN_DISABLED_INTEGRATIONS switches it off, and a release outside its
range gets one warning and is left alone; either way the tracker's own exit hook keeps the run
whole. Each tracker's reader (`read`) and what a whole run reads as (`WHOLE`) come from its
own test module, and what its job needs in its environment (`job_env`: clearml's server)."""

import importlib

import pytest

from helpers import fake_distribution, tracker_job

from autoteardown.integrations import TABLE

BELOW = {"swanlab": "0.9.0", "trackio": "0.39.0", "comet": "3.50.0", "aim": "3.28.0",
         "clearml": "2.0.0"}  # under each range


def tracker(library):
    """Its test module (skipped when the library is not installed)."""
    pytest.importorskip(TABLE[library].triggers[0])
    return importlib.import_module(f"test_{library}")


def job(jobs, library, module, **env):
    """tracker_job.py's run never ended, ending with sys.exit(3)."""
    extra = module.job_env(jobs) if hasattr(module, "job_env") else {}
    return tracker_job(jobs, library, "one", "exit3", **extra, **env)


@pytest.mark.parametrize("library", BELOW)
def test_is_patched_by_default(jobs, library):  # the PATCHED line of the tests below says True too
    module = tracker(library)
    assert "PATCHED: True" in job(jobs, library, module).stdout


@pytest.mark.parametrize("library", BELOW)
def test_can_be_disabled(jobs, library):
    module = tracker(library)
    result = job(jobs, library, module, AUTOTEARDOWN_DISABLED_INTEGRATIONS=library)
    assert "PATCHED: False" in result.stdout and "autoteardown:" not in result.stderr, result
    assert module.read(jobs.dir) == module.WHOLE, result


@pytest.mark.parametrize("library", BELOW)
def test_an_unsupported_version_warns_once_and_leaves_the_library_alone(jobs, tmp_path, library):
    module, (requirement, *_) = tracker(library), TABLE[library].requires
    path = fake_distribution(tmp_path, requirement.distribution, BELOW[library])
    result = job(jobs, library, module, PYTHONPATH=path)
    assert "PATCHED: False" in result.stdout and result.stderr.count("autoteardown:") == 1, result
    need = str(requirement).split(" ", 1)[1]
    assert (f"{requirement.distribution} {BELOW[library]} is not supported (need {need}); "
            f"{TABLE[library].looks_after} are left alone") in result.stderr, result
    assert module.read(jobs.dir) == module.WHOLE, result
