"""Ray benchmarks: print numbers, assert nothing.
Run: python tests/benchmark_ray.py [--runs N] [--only reap,two-node,train,exit,end-from-actor,kill-40]

- reap: time from __ray_terminate__ to a dead process for actors whose teardown
  hangs, on this node (the goal: the grace period + 1 s at most);
- two-node: the same for an actor on a second node (ray.cluster_utils.Cluster,
  both nodes on 127.0.0.1), each run's figure and how many met grace + 1 s;
- train: Ray Train (v2 where the Ray has it) rank 0's wandb steps kept, with and without the shim;
- exit: driver exit time of the verl-style TaskRunner script, with and without the shim;
- end-from-actor: how long an actor's __ray_terminate__ / ray.kill call takes, with and without the
  shim (an actor hands nothing on: the ended actor's guard ends it), 5 calls of each a run;
- kill-40: a controller actor ray.kills 40 busy actors back to back, with and without the shim:
  each call's cost, the guard processes alive right after the last call (count, RSS), and the
  same with the Ray gcs_server the script started stopped (SIGSTOP) during the calls.
Every process a run reports is killed by pid afterwards; the cluster by pid too.
"""

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import SCRIPTS, kill_pids, python  # noqa: E402
from helpers import reported as pids  # noqa: E402

GRACE = 5.0


def script(name, *args, shim, **env):
    started = time.monotonic()
    proc = python([SCRIPTS / name, *args], shim=shim, env=env, timeout=400)
    return proc, time.monotonic() - started, time.monotonic()


def gone_after(proc):
    match = re.search(r"^GONE_AFTER: (\S+)", proc.stdout, re.M)
    return float(match.group(1)) if match else float("nan")


def reap_times(runs, grace, **env):
    times = []
    for _ in range(runs):
        proc, _, _ = script("ray_hung_actors.py", "off", shim=True, AUTOTEARDOWN_RAY_GRACE_S=grace,
                            WATCH_S=float(grace) + 5, **env)
        kill_pids(pids(proc.stdout, "PIDS") + pids(proc.stdout, "BYSTANDER"))
        times.append(gone_after(proc))
    return times


def two_nodes():
    from test_ray_cluster import two_node_cluster

    return two_node_cluster()


def train_steps(runs, shim):
    kept = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as folder:
            os.makedirs(folder + "/ranks")
            proc, _, _ = script("ray_train_job.py", "return", shim=shim, WANDB_DIR=folder,
                                WANDB_CACHE_DIR=folder + "/cache", OUT_DIR=folder + "/ranks")
            for rank in Path(folder, "ranks").glob("rank?"):
                info = json.loads(rank.read_text())
                kill_pids([info["pid"], *info["children"]])
            from wandb_records import exit_codes, history_steps, records, run_files

            files = run_files(folder)
            recs = records(files[0]) if files else []
            kept.append((len(history_steps(recs)), exit_codes(recs)))
    return kept


def driver_exit(runs, shim):
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as folder:
            proc, _, ended = script("ray_task_runner.py", "end", shim=shim, WANDB_DIR=folder,
                                    WANDB_CACHE_DIR=folder + "/cache")
            kill_pids(pids(proc.stdout, "ACTOR") + pids(proc.stdout, "CHILDREN"))
            end = float(re.search(r"^END: (\S+)", proc.stdout, re.M).group(1))
            times.append(ended - end)
    return statistics.median(times)


def end_from_actor(runs, shim):
    """{"TERMINATE_MS": [...], "KILL_MS": [...]}: every call of every run."""
    calls: dict = {"TERMINATE_MS": [], "KILL_MS": []}
    for _ in range(runs):
        proc, _, _ = script("ray_end_from_actor.py", shim=shim)
        kill_pids(pids(proc.stdout, "CHILDREN"))
        for tag in calls:
            match = re.search(rf"^{tag}: (.*)$", proc.stdout, re.M)
            calls[tag] += [float(ms) for ms in match.group(1).split()] if match else []
    return calls


def kill_40(runs, shim, stop_gcs):
    """(each call's ms, [(guards, their RSS MB) a run])."""
    calls, guards = [], []
    for _ in range(runs):
        proc, _, _ = script("ray_nw_kill_many.py", shim=shim, N=40, STOP_GCS=int(stop_gcs))
        kill_pids(pids(proc.stdout, "PIDS"))
        match = re.search(r"^CALL_MS: (.*)$", proc.stdout, re.M)
        calls += [float(ms) for ms in match.group(1).split()] if match else []
        match = re.search(r"^GUARDS: (\d+) (\d+)", proc.stdout, re.M)
        guards += [(int(match.group(1)), int(match.group(2)))] if match else []
    return calls, guards


def line(label, value):
    print(f"{label:<62}{value}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="reap,two-node,train,exit,end-from-actor,kill-40")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if "reap" in only:
        for grace in ("2", "5"):
            times = reap_times(args.runs, grace)
            line(f"__ray_terminate__ -> hung actor dead, this node, grace {grace} s",
                 f"median {statistics.median(times):.2f} s, max {max(times):.2f} s ({args.runs} runs)")
    if "two-node" in only:
        with two_nodes() as address:
            times = reap_times(args.runs, str(GRACE), RAY_ADDRESS=address, RAY_AUTH_MODE="disabled",
                               HUNG_ON_NODE="second_node")
        met = sum(t <= GRACE + 1 for t in times)
        line(f"__ray_terminate__ -> hung actor dead, second node, grace {GRACE:g} s",
             f"{' '.join(f'{t:.2f}' for t in times)} s; within grace + 1 s: {met} of {len(times)}")
    if "train" in only:
        for shim in (True, False):
            kept = train_steps(args.runs, shim)
            line(f"Ray Train rank 0 steps kept of 10 (exit record), {'autoteardown' if shim else 'no shim'}",
                 ", ".join(f"{n} ({codes})" for n, codes in kept))
    if "exit" in only:
        with_shim, without = driver_exit(args.runs, True), driver_exit(args.runs, False)
        line("TaskRunner driver exit, autoteardown", f"{with_shim:.2f} s")
        line("TaskRunner driver exit, no shim (loses the wandb run)", f"{without:.2f} s (x{with_shim / without:.2f})")

    if "end-from-actor" in only:
        for shim in (True, False):
            for tag, took in end_from_actor(args.runs, shim).items():
                call = "__ray_terminate__" if tag == "TERMINATE_MS" else "ray.kill"
                line(f"{call} sent by an actor, {'autoteardown' if shim else 'no shim'}",
                     f"median {statistics.median(took):.1f} ms, {min(took):.1f}-{max(took):.1f} ms ({len(took)} calls)"
                     if took else "no figures (see the script's output)")
    if "kill-40" in only:
        for stop_gcs in (False, True):
            for shim in (True, False):
                took, guards = kill_40(args.runs, shim, stop_gcs)
                line(f"40 ray.kill by an actor{', gcs_server stopped' if stop_gcs else ''}, "
                     f"{'autoteardown' if shim else 'no shim'}",
                     f"median {statistics.median(took):.1f} ms a call, {sum(took) / max(1, len(guards)):.0f} ms "
                     f"in all; guards left {', '.join(f'{n} ({mb} MB)' for n, mb in guards)}"
                     if took else "no figures (see the script's output)")


if __name__ == "__main__":
    main()
