"""The teardown report (AUTOTEARDOWN_DEBUG=1, AUTOTEARDOWN_REPORT=path.jsonl): resources named
as a user knows them, the trigger and exit code, one JSON line per process."""

import json
import re
import subprocess
import sys

import pytest

from helpers import ROOT, base_env, free_port, python, wait_for_ranks


def test_describe_never_raises_and_falls_back_to_the_type_name():
    from autoteardown import report

    class Weird:
        def __getattr__(self, name):
            raise RuntimeError(name)

    for kind in ("dataloader", "wandb", "ray", "process_group", "tensorboard", "mlflow", "unknown"):
        assert report.describe(kind, Weird()) in ("Weird", "run", "DataLoader (no workers)"), kind
    assert report.describe("wandb", None).startswith("teardown, its exit hook")


@pytest.mark.needs_torch
def test_report_is_not_imported_by_default():
    code = "import sys, autoteardown, torch.utils.data; print('autoteardown.report' in sys.modules)"
    result = python(code, shim=False, pythonpath=ROOT, timeout=60)
    assert result.stdout.strip() == "False", result


@pytest.mark.needs_torch
def test_real_resources_are_named_as_the_user_knows_them(jobs, tmp_path):
    out = tmp_path / "report.jsonl"
    result = jobs.run("report_describe.py", tmp_path, shim=False, timeout=180,
                      PYTHONPATH=str(ROOT), AUTOTEARDOWN_DISABLE=1, AUTOTEARDOWN_DEBUG=1,
                      AUTOTEARDOWN_REPORT=out, PORT=free_port())
    assert result.returncode == 0 and "DONE" in result.stdout, result
    names = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    lines = [line for line in result.stdout.splitlines() if line.startswith("dataloader: ")]
    assert re.fullmatch(r"dataloader: DataLoader with 2 worker\(s\) \(pid \d+, \d+\)", lines[0]), lines
    assert re.fullmatch(r"dataloader: DataLoader with 2 worker\(s\) \(pid \d+, \d+: stopped\)", lines[1]), lines
    assert re.fullmatch(r"dataloader: DataLoader with 2 worker\(s\) \(pid \d+: killed \(SIGKILL\), pid \d+: running\)",
                        lines[2]), lines
    assert re.fullmatch(r"run \w+ \(describe-me\) in project autoteardown-tests", names["wandb"]), names
    assert names["fork child wandb"] == names["wandb"]
    assert names["process_group"] == "gloo group of 1 rank(s)"
    assert names["tensorboard"] == f"SummaryWriter {tmp_path / 'tb'}"
    assert re.fullmatch(r"run [0-9a-f]{32} \(described\)", names["mlflow"]), names
    assert names["ray"] == "object" and names["nonesuch"] == "int" and names["broken wandb"] == "Broken"
    actor_id = names["actor id"]
    assert f"ray: actor Trainer {actor_id[:8]}" in result.stdout
    # The stderr lines, each with the pid.
    pid = re.search(r"\[pid (\d+)\] DEBUG: armed: autoteardown \S+ on Python \S+, activated by import",
                    result.stderr).group(1)
    for expected in ("teardown started by SIGTERM; exit code handed on: 143",
                     "  finalized in 0.010s: dataloader DataLoader with 2 worker(s) (pid",
                     "  failed: RuntimeError: injected in 0.030s: wandb teardown, its exit hook",
                     f"  left behind in 5.000s: ray actor Trainer {actor_id[:8]}",
                     "teardown done in 5.060s: 2 finalized, 1 failed, 1 left behind"):
        assert f"autoteardown: [pid {pid}] DEBUG: {expected}" in result.stderr, (expected, result.stderr)
    # One JSON line for the process (the second, empty teardown adds none).
    (line,) = out.read_text().splitlines()
    data = json.loads(line)
    assert data["pid"] == int(pid) and data["activation"] == "import" and data["trigger"] == "SIGTERM"
    assert data["code"] == 143 and data["config"]["AUTOTEARDOWN_TIMEOUT"] == 10.0
    assert [(s["kind"], s["outcome"]) for s in data["steps"]] == [
        ("dataloader", "finalized"), ("wandb", "finalized"), ("wandb", "failed: RuntimeError: injected"),
        ("ray", "left behind")]


@pytest.mark.needs_torch
# torchrun: it SIGTERMs each rank's process group, so the DataLoader workers die with the rank
# and torch's SIGCHLD handler raises "killed by signal" into the engine's wait (which must
# not abort the teardown). ranks: the ranks alone, as a scheduler signalling them would.
@pytest.mark.parametrize("target", ["torchrun", "ranks"])
def test_the_report_of_a_sigterm_to_a_two_rank_torchrun_job(jobs, tmp_path, target):
    import os
    import signal

    out = tmp_path / "report.jsonl"
    script = str(ROOT / "tests" / "scripts" / "report_torchrun.py")
    env = base_env(shim=True, AUTOTEARDOWN_DEBUG=1, AUTOTEARDOWN_REPORT=out, WANDB_DIR=tmp_path,
                   WANDB_CACHE_DIR=tmp_path / "cache", OMP_NUM_THREADS=1)
    proc = jobs.popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                       "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script],
                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = wait_for_ranks(proc, timeout=120)
    if target == "torchrun":
        proc.send_signal(signal.SIGTERM)  # torchrun hands it on to both ranks (their process groups)
    else:
        for text in seen:
            if text.startswith("PIDS:"):
                os.kill(int(text.split()[1]), signal.SIGTERM)  # the rank itself, as a scheduler would
    result = jobs.finish(proc, timeout=120, before="".join(seen))
    # Three processes share the one stderr pipe: torchrun's own traceback (small writes) may
    # land in front of a rank's line, so lines are found by their prefix, not anchored.
    debug = re.findall(r"autoteardown: \[pid \d+(?: rank ([01]))?\] DEBUG: (.*)", result.stderr)
    assert debug and len(debug) == result.stderr.count(" DEBUG: "), result.stderr
    for rank in "01":
        mine = "\n".join(text for of, text in debug if of == rank)
        assert re.search(r"^armed: autoteardown \S+ on Python \S+, activated by sitecustomize", mine, re.M), mine
        assert "teardown started by SIGTERM; exit code handed on: 143" in mine, mine
        assert re.search(r"finalized in \S+s: dataloader DataLoader with 2 worker\(s\) \(pid \d+, \d+", mine), result
        # torchrun's killpg SIGTERMs wandb-core too: whether it still takes the run's end
        # (or hangs in its teardown) is wandb's timing; that it is reported is ours.
        wandb_ends = r"finalized in" if target == "ranks" else r"(finalized|failed|left behind) in"
        assert re.search(rf"{wandb_ends} \S+s: wandb run \w+ \(rank-{rank}\)", mine), mine
        assert re.search(r"finalized in \S+s: process_group gloo group of 2 rank\(s\)", mine), mine
        done = r"\d+ finalized" if target == "ranks" else r"\d+ finalized.*"
        assert re.search(rf"^teardown done in \S+s: {done}$", mine, re.M), mine
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["rank"] for line in lines) == [0, 1], lines
    for line in lines:
        assert line["trigger"] == "SIGTERM" and line["code"] == 143, line
        assert {"dataloader", "process_group", "wandb"} <= {s["kind"] for s in line["steps"]}, line
        assert all(s["outcome"] == "finalized" for s in line["steps"] if target == "ranks" or s["kind"] != "wandb"), line
    assert sorted(os.path.basename(p) for p in map(str, tmp_path.glob("wandb/*run-*")))
