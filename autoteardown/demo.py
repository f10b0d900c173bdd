"""`python -m autoteardown demo`: a tiny verl-shaped job run without and with the
shim, with a side-by-side report of how each run ended.

The job (below, written to a temporary folder): a local Ray driver starts a
TaskRunner actor; the TaskRunner trains on a StatefulDataLoader with workers,
logs to a wandb run (offline), and ends a worker actor whose teardown hangs
with `__ray_terminate__`; the driver gets the result and simply ends.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

JOB = r'''
import json, os, sys, time
import psutil, ray

@ray.remote(num_cpus=0)
class Worker:
    def __init__(self):
        import atexit
        atexit.register(time.sleep, 1000)  # a teardown that never ends (a stuck NCCL or torch shutdown)
    def step(self, batch):
        return os.getpid()

@ray.remote(num_cpus=1)
class TaskRunner:
    def fit(self, steps):
        import wandb
        from torchdata.stateful_dataloader import StatefulDataLoader
        self.loader = StatefulDataLoader(list(range(10_000)), batch_size=8, num_workers=2)
        self.batches = iter(self.loader)
        self.tracker = wandb.init(project="autoteardown-demo")
        worker = Worker.remote()
        worker_pid = ray.get(worker.step.remote(None))
        worker.__ray_terminate__.remote()  # done with it
        for step in range(steps):
            batch = next(self.batches)
            self.tracker.log({"loss": 1.0 / (step + 1), "batch_mean": float(batch.float().mean())})
            time.sleep(0.2)
        core = [p.pid for p in psutil.Process().children(recursive=True) if "wandb-core" in p.name()]
        return {"runner": os.getpid(), "dataloader_workers": [w.pid for w in self.batches._workers],
                "wandb_core": core, "worker_actor": worker_pid, "steps": steps}

ray.init(num_cpus=2, include_dashboard=False)
runner = TaskRunner.remote()
print("PIDS " + json.dumps(ray.get(runner.fit.remote(15))), flush=True)
print("END %f" % time.monotonic(), flush=True)
'''

NOISE = ("killed by signal", "Exception ignored", "ConnectionResetError", "BrokenPipeError")


def demo(argv=()):
    try:
        import psutil  # noqa: F401
        import ray  # noqa: F401
        import torchdata  # noqa: F401
        import wandb  # noqa: F401
    except ImportError as exc:
        print(f"the demo needs torch, torchdata, wandb, ray and psutil: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="autoteardown-demo-") as folder:
        job = os.path.join(folder, "train.py")
        with open(job, "w") as f:
            f.write(JOB)
        results = []
        for index, shim in enumerate((False, True), 1):
            label = "with autoteardown" if shim else "without autoteardown"
            print(f"[{index}/2] running the job {label} ...", flush=True)
            results.append(run_job(job, os.path.join(folder, label.replace(" ", "-")), shim))
            print(f"      done in {results[-1]['wall']:.1f}s", flush=True)
    print()
    print(report(results))
    return 0


def run_job(job, folder, shim):
    import psutil

    os.makedirs(folder)
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=folder,
               WANDB_CACHE_DIR=os.path.join(folder, "cache"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               PYTHONWARNINGS="ignore", AUTOTEARDOWN_RAY_GRACE_S="2")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if shim:
        from .cli import bootstrap_dir

        package_parent = os.path.dirname(os.path.dirname(bootstrap_dir()))
        paths = [bootstrap_dir(), package_parent] + paths
    else:
        env["AUTOTEARDOWN_DISABLE"] = "1"  # even if a sitecustomize of yours activates it
    env["PYTHONPATH"] = os.pathsep.join(paths)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, job], env=env, capture_output=True, text=True, timeout=180)
    ended = time.monotonic()
    pids = {}
    match = re.search(r"^PIDS (.*)$", proc.stdout, re.M)
    if match:
        pids = json.loads(match.group(1))
    end = re.search(r"^END (\S+)$", proc.stdout, re.M)
    time.sleep(1.0)  # what is still alive a second after the job ended
    alive = lambda ps: [p for p in ps if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]  # noqa: E731
    leftovers = {
        "dataloader_workers": alive(pids.get("dataloader_workers", [])),
        "wandb_core": alive(pids.get("wandb_core", [])),
        "zombie_actors": alive([pids["worker_actor"]] if "worker_actor" in pids else []),
    }
    for group in leftovers.values():  # the demo leaves nothing behind
        for pid in group:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
    return {
        "shim": shim, "status": proc.returncode, "wall": ended - started,
        "exit_time": ended - float(end.group(1)) if end else None,
        "tracebacks": len(re.findall(r"Traceback \(most recent call last\)", proc.stderr)),
        "noise": sorted({n for n in NOISE if n in proc.stderr}),
        "wandb": wandb_summary(folder),
        "steps": pids.get("steps"), **leftovers,
    }


def wandb_summary(folder):
    """History steps, summary and exit records kept in the run file."""
    from wandb.proto import wandb_internal_pb2

    files = []
    for dirpath, _, names in os.walk(os.path.join(folder, "wandb")):
        files += [os.path.join(dirpath, n) for n in names if n.startswith("run-") and n.endswith(".wandb")]
    if not files:
        return {"history": 0, "summary": 0, "exit": None}
    counts = {"history": 0, "summary": 0, "exit": None}
    for payload in _run_file_payloads(open(files[0], "rb").read()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind in ("history", "summary"):
            counts[kind] += 1
        elif kind == "exit":
            counts["exit"] = record.exit.exit_code
    return counts


def _run_file_payloads(data):
    # A 7-byte W&B header, then LevelDB log blocks (32 KiB) of chunks: crc32, length, type.
    import struct

    pos, parts = 7, []
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        if room < 7 or (length, kind) == (0, 0):
            pos += room
            continue
        chunk = data[pos + 7:pos + 7 + length]
        if len(chunk) < length:
            return
        pos += 7 + length
        parts = [chunk] if kind in (1, 2) else parts + [chunk]
        if kind in (1, 4):
            yield b"".join(parts)


def report(results):
    without, with_ = results
    rows = [
        ("exit status", "status", str),
        ("tracebacks printed", "tracebacks", str),
        ("exit noise", "noise", lambda n: ", ".join(n) or "none"),
        ("wandb history steps kept", "wandb", lambda w: f"{w['history']}"),
        ("wandb summary records", "wandb", lambda w: f"{w['summary']}"),
        ("wandb exit record (code)", "wandb", lambda w: "missing" if w["exit"] is None else f"yes ({w['exit']})"),
        ("DataLoader workers left", "dataloader_workers", lambda p: str(len(p))),
        ("wandb-core left", "wandb_core", lambda p: str(len(p))),
        ("zombie actors (DEAD, still running)", "zombie_actors", lambda p: str(len(p))),
        ("exit time (s)", "exit_time", lambda t: "-" if t is None else f"{t:.1f}"),
    ]
    width = 38
    lines = [f"{'job of ' + str(without['steps'] or '?') + ' logged steps':<{width}}{'without':>14}{'with':>14}",
             "-" * (width + 28)]
    for title, key, fmt in rows:
        lines.append(f"{title:<{width}}{fmt(without[key]):>14}{fmt(with_[key]):>14}")
    return "\n".join(lines)
