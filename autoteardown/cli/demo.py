"""`autoteardown demo`: small jobs that show each symptom autoteardown fixes, each run
without and then with it, and what differed, measured for real (exit status,
stderr, the wandb run file on disk, processes still running).

Imported only by the CLI, never by `import autoteardown`. The jobs (below) are
written to a temporary folder; they need torch, torchdata, wandb (run offline),
ray and psutil. Nothing is left running: each job's processes are killed by pid
once measured.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

STEPS = 10          # steps each job logs to wandb
RAY_GRACE = "2"     # AUTOTEARDOWN_RAY_GRACE_S for the demo (default 5), to keep it short
AFTER = 1.0         # what is still running this long after a job ended counts as left behind

FORK_JOB = r'''
# A DataLoader with workers; a child made with os.fork() (a checkpoint writer, a
# library's helper) ends normally; the training loop goes on.
import os, sys, torch
from torch.utils.data import DataLoader
if os.environ.get("DEMO_FAIL_ON_PURPOSE"):
    raise RuntimeError("failing on purpose (autoteardown demo --fail-job)")
batches = iter(DataLoader(list(range(10_000)), batch_size=8, num_workers=2))
next(batches)
print("PIDS", *[w.pid for w in batches._workers], flush=True)
if os.fork() == 0:
    sys.exit(0)  # the child is done
os.wait()
print("FORKED", flush=True)
for _ in range(50):
    next(batches)
print("DONE", flush=True)
'''

SIGTERM_JOB = r'''
# A DataLoader with workers and a wandb run; the job is stopped with SIGTERM (as
# Slurm, Kubernetes or a timeout do) while it trains.
import os, time, psutil, torch, wandb
from torch.utils.data import DataLoader
if os.environ.get("DEMO_FAIL_ON_PURPOSE"):
    raise RuntimeError("failing on purpose (autoteardown demo --fail-job)")
batches = iter(DataLoader(list(range(10_000)), batch_size=8, num_workers=2))
run = wandb.init(project="autoteardown-demo")
for step in range(STEPS):
    run.log({"loss": 1.0 / (step + 1), "batch": float(next(batches).float().mean())})
core = [p.pid for p in psutil.Process().children(recursive=True) if "wandb-core" in p.name()]
print("PIDS", *[w.pid for w in batches._workers], *core, flush=True)
print("READY", flush=True)
while True:  # still training when the SIGTERM comes
    next(batches)
    time.sleep(0.05)
'''.replace("STEPS", str(STEPS))

RAY_JOB = r'''
# A Ray job shaped like verl's: the driver starts a TaskRunner actor that trains on a
# StatefulDataLoader and logs to wandb; a worker actor, ended with __ray_terminate__,
# hangs in its teardown (a stuck NCCL or torch shutdown). The driver then simply ends.
import os, time, psutil, ray

@ray.remote(num_cpus=0)
class Worker:
    def __init__(self):
        import atexit
        atexit.register(time.sleep, 1000)  # a teardown that never ends
    def pid(self):
        return os.getpid()

@ray.remote(num_cpus=1)
class TaskRunner:
    def fit(self, steps):
        import wandb
        from torchdata.stateful_dataloader import StatefulDataLoader
        self.batches = iter(StatefulDataLoader(list(range(10_000)), batch_size=8, num_workers=2))
        self.run = wandb.init(project="autoteardown-demo")
        worker = Worker.remote()
        worker_pid = ray.get(worker.pid.remote())
        worker.__ray_terminate__.remote()  # done with it
        for step in range(steps):
            self.run.log({"loss": 1.0 / (step + 1), "batch": float(next(self.batches).float().mean())})
        return worker_pid

if os.environ.get("DEMO_FAIL_ON_PURPOSE"):
    raise RuntimeError("failing on purpose (autoteardown demo --fail-job)")
ray.init(address="local", num_cpus=2, include_dashboard=False)  # a new local Ray, never a running one
runner = TaskRunner.remote()
print("ACTOR", ray.get(runner.fit.remote(STEPS)), flush=True)
'''.replace("STEPS", str(STEPS))

# name: (title, script, the line that shows the job's own code got where it should)
JOBS = {
    "fork": ("A DataLoader job whose os.fork() child ends normally", FORK_JOB, "PIDS"),
    "sigterm": (f"A DataLoader + wandb job stopped with SIGTERM after {STEPS} steps", SIGTERM_JOB, "READY"),
    "ray": ("A Ray job: a TaskRunner actor logs to wandb, a worker actor's teardown hangs", RAY_JOB, "ACTOR"),
}

LEGEND = {
    "killed by signal": 'torch printed "DataLoader worker (pid N) is killed by signal: Terminated": the fork '
                        "child's exit stopped the parent's workers and the training loop died",
    "exit status": "the job's exit status (0: success; -15: ended by SIGTERM, which is right for a SIGTERM)",
    "wandb steps kept": f"history steps of the {STEPS} logged that are in the wandb run file on disk",
    "wandb exit record": "whether the run file has its exit record (a finished run) and its exit code "
                         "(143 = 128 + SIGTERM)",
    "processes left": f"the job's DataLoader workers and wandb-core still running {AFTER:g} s after it ended",
    "dead actors running": "actors Ray reports DEAD whose process still runs (and would hold its GPU memory) "
                           f"{AFTER:g} s after the job ended",
}


def demo(fail_job=None, only=None):
    missing = [m for m in ("psutil", "ray", "torch", "torchdata", "wandb") if not _importable(m)]
    if missing:
        print(f"autoteardown demo needs torch, torchdata, wandb, ray and psutil; missing: {', '.join(missing)}\n"
              '  pip install "autoteardown[all]"', file=sys.stderr)
        return 2
    jobs = {name: JOBS[name] for name in (only or JOBS)}
    print("autoteardown demo: each job runs without, then with autoteardown (through its sitecustomize, as\n"
          "`autoteardown run` does); nothing in the job's code changes.")
    print(f"settings: WANDB_MODE=offline, Ray local (num_cpus=2), AUTOTEARDOWN_RAY_GRACE_S={RAY_GRACE} "
          f"(default 5),\n          left behind = still running {AFTER:g} s after the job ended\n", flush=True)
    results, failures = {}, []
    with tempfile.TemporaryDirectory(prefix="autoteardown-demo-") as folder:
        index, total = 0, 2 * len(jobs)
        for name, (_, script, marker) in jobs.items():
            path = os.path.join(folder, f"{name}_job.py")  # not ray.py: it would shadow ray
            with open(path, "w") as f:
                f.write(script)
            for shim in (False, True):
                index += 1
                label = "with" if shim else "without"
                print(f"[{index}/{total}] {name} job {label} autoteardown ...", end=" ", flush=True)
                fail = fail_job == name and shim
                result = run_job(name, path, os.path.join(folder, f"{name}-{label}"), shim, marker, fail)
                results[(name, shim)] = result
                print(f"{result['wall']:.1f}s" + ("  FAILED" if result["failed"] else ""), flush=True)
                if result["failed"]:
                    failures.append((name, label, result))
    print()
    print(report(results))
    for name, label, result in failures:
        print(f"\nThe {name} job {label} autoteardown failed ({result['failed']}); "
              f"exit status {result['status']}. The end of its stderr:")
        tail = result["stderr"].strip().splitlines()[-15:]
        print("\n".join("  | " + line for line in tail) or "  | (empty)")
    print("\nTry it on your script:\n"
          "  autoteardown run python train.py            # or: autoteardown run -- torchrun ... train.py\n"
          "  autoteardown run -d python train.py         # the same, with the teardown report on stderr\n"
          "  autoteardown doctor                         # what it will patch here")
    return 1 if failures else 0


def _importable(module):
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run_job(name, path, folder, shim, marker, fail=False):
    os.makedirs(folder)
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=folder,
               WANDB_CACHE_DIR=os.path.join(folder, "cache"), WANDB_DATA_DIR=os.path.join(folder, "data"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1",
               AUTOTEARDOWN_RAY_GRACE_S=RAY_GRACE)
    env.pop("DEMO_FAIL_ON_PURPOSE", None)
    if fail:
        env["DEMO_FAIL_ON_PURPOSE"] = "1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if shim:
        from . import pythonpath_entries

        paths = pythonpath_entries() + paths
        env.pop("AUTOTEARDOWN_DISABLE", None)
    else:
        env["AUTOTEARDOWN_DISABLE"] = "1"  # even if a sitecustomize of yours activates it
    env["PYTHONPATH"] = os.pathsep.join(paths)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, path], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    stdout, stderr, failed = _communicate(proc, marker, sigterm=(name == "sigterm"), timeout=150)
    wall = time.monotonic() - started
    pids = [int(p) for line in stdout.splitlines() if line.startswith(("PIDS ", "ACTOR "))
            for p in line.split()[1:]]
    actor = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("ACTOR ")]
    time.sleep(AFTER)
    left = _alive(p for p in pids if p not in actor)
    dead_running = _alive(actor)
    _kill([*pids, *_session(proc.pid)])
    if not failed and marker not in stdout:
        failed = f"its code did not get to {marker!r}"
    records = _wandb(folder)
    return {"status": proc.returncode, "wall": wall, "stdout": stdout, "stderr": stderr, "failed": failed,
            "killed by signal": "killed by signal" in stderr, "tracebacks": stderr.count("Traceback (most"),
            "left": len(left), "dead_running": len(dead_running), **records}


def _communicate(proc, marker, sigterm, timeout):
    """Wait for the job (SIGTERM it once it prints `marker`, for the SIGTERM job)."""
    failed = None
    if sigterm:
        deadline = time.monotonic() + timeout
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(marker) or time.monotonic() > deadline:
                break
        if any(line.startswith(marker) for line in lines):
            time.sleep(0.5)  # mid-training
            proc.send_signal(signal.SIGTERM)
        stdout_head = "".join(lines)
    else:
        stdout_head = ""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(_session(proc.pid))
        stdout, stderr = proc.communicate()
        failed = f"no end after {timeout}s"
    return stdout_head + stdout, stderr, failed


def _alive(pids):
    import psutil

    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.Error:
            pass
    return found


def _session(sid):
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and os.getsid(process.pid) == sid:
                found.append(process.pid)
        except (OSError, psutil.Error):
            pass
    return found


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _wandb(folder):
    from . import wandb_records

    files = wandb_records.run_files(folder)
    if not files:
        return {"steps": None, "exit": None}
    try:
        records = wandb_records.records(files[0])
    except Exception:
        return {"steps": None, "exit": None}
    codes = wandb_records.exit_codes(records)
    return {"steps": len(wandb_records.history_steps(records)), "exit": codes[-1] if codes else None}


# ---- the table -----------------------------------------------------------------

ROWS = {  # job -> (row title, legend key, value)
    "fork": [('"killed by signal" printed', "killed by signal", lambda r: "yes" if r["killed by signal"] else "no"),
             ("exit status", "exit status", lambda r: str(r["status"]))],
    "sigterm": [("wandb steps kept", "wandb steps kept", lambda r: "no run file" if r["steps"] is None
                 else f"{r['steps']} of {STEPS}"),
                ("wandb exit record", "wandb exit record", lambda r: "missing" if r["exit"] is None
                 else f"yes ({r['exit']})"),
                ("processes left behind", "processes left", lambda r: str(r["left"])),
                ("exit status", "exit status", lambda r: str(r["status"]))],
    "ray": [("wandb steps kept (logged in the actor)", "wandb steps kept", lambda r: "no run file"
             if r["steps"] is None else f"{r['steps']} of {STEPS}"),
            ("DEAD actors still running", "dead actors running", lambda r: str(r["dead_running"])),
            ("processes left behind", "processes left", lambda r: str(r["left"])),
            ("exit status", "exit status", lambda r: str(r["status"]))],
}


def report(results):
    """Only rows whose two columns differ; the others are named below the table."""
    width, col = 42, 13
    lines = [f"{'':<{width}}{'without':>{col}}{'with':>{col}}", "-" * (width + 2 * col)]
    legends, same = [], []
    for number, (name, (title, _, _)) in enumerate(JOBS.items(), 1):
        if (name, False) not in results and (name, True) not in results:
            continue  # not run (--only)
        without, with_ = results.get((name, False)), results.get((name, True))
        lines.append(f"{number}. {title}")
        shown = 0
        for row, key, value in ROWS[name]:
            if without is None or with_ is None or without["failed"] or with_["failed"]:
                break
            a, b = value(without), value(with_)
            if a == b:
                same.append(f"{row} of job {number} ({a})")
                continue
            shown += 1
            lines.append(f"   {row:<{width - 3}}{a:>{col}}{b:>{col}}")
            if key not in legends:
                legends.append(key)
        if not shown:
            lines.append("   (no comparison: a run failed, see below)" if any(
                r is None or r["failed"] for r in (without, with_)) else "   (no difference this time)")
    if same:
        lines.append("\nthe same in both runs, so not shown: " + "; ".join(same))
    if legends:
        lines.append("\nwhat the rows mean:")
        lines += [f"  {key}: {LEGEND[key]}" for key in legends]
    return "\n".join(lines)
