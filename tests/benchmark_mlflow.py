"""Benchmark: what the mlflow integration costs. Prints numbers, asserts nothing.
Run: python tests/benchmark_mlflow.py [--alone-server-gone]

- the patch applied when mlflow is imported: importing the integration and wrapping
  `start_run` (with and without wrapt already imported), timed inside one process,
  since it is a few ms against an `import mlflow` of about a second;
- what recording a run adds to each `mlflow.start_run()` (which itself takes ms on sqlite);
- the exit of a one-run script on sqlite, autoteardown vs mlflow alone;
- with --alone-server-gone, also mlflow alone's exit once the tracking server is
  gone (minutes: mlflow retries each HTTP call), against autoteardown's.
"""

import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers  # noqa: E402
from helpers import base_env, free_port  # noqa: E402

RUNS = 11
ENV = {"MLFLOW_DISABLE_TELEMETRY": "true"}

PATCH_COST = """
import sys, time
import autoteardown  # AUTOTEARDOWN_DISABLED_INTEGRATIONS=mlflow: the hook is not applied
import mlflow
if sys.argv[1] == "wrapt-imported":
    import wrapt
started = time.perf_counter()
from autoteardown import integrations
integrations.instrument("mlflow")
print("MS", (time.perf_counter() - started) * 1e3)
"""

PER_RUN = """
import sys, time
import mlflow
from autoteardown.integrations import mlflow as integration
mlflow.set_tracking_uri(sys.argv[1])
run = mlflow.start_run()
stack = integration._stack()
times = []
for _ in range(1000):
    started = time.perf_counter()
    integration._record(run, stack)
    times.append(time.perf_counter() - started)
times.sort()
print("MS", times[len(times) // 2] * 1e3)
"""

ONE_RUN = """
import time, mlflow
mlflow.start_run()
for step in range(10):
    mlflow.log_metric("loss", 1 / (step + 1), step=step)
print("END", time.monotonic(), flush=True)
"""


def python(code, *args, shim=True, timeout=300, **env):
    proc = helpers.python(code, *args, shim=shim, env={**ENV, **env}, timeout=timeout,
                          cwd=tempfile.gettempdir())  # not here: an older mlflow makes ./mlruns
    if proc.returncode != 0 and "END" not in proc.stdout:
        raise RuntimeError(proc.stderr[-2000:])
    return proc


def figure(proc, tag="MS"):
    return float(re.search(rf"^{tag} (\S+)", proc.stdout, re.M).group(1))


def exit_time(uri, shim, timeout=300):
    proc = python(ONE_RUN, shim=shim, timeout=timeout, MLFLOW_TRACKING_URI=uri)
    return time.monotonic() - figure(proc, "END")


def medians(func, *variants):
    # Alternated, so that a busy machine slows every variant alike.
    times = {variant: [] for variant in variants}
    for _ in range(RUNS):
        for variant in variants:
            times[variant].append(func(variant))
    return [statistics.median(times[v]) for v in variants]


def line(label, value, unit="ms", extra=""):
    print(f"{label:<66}{value:9.2f} {unit}{extra}")


def server_gone_exit(folder, shim):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder}/server.db", "--default-artifact-root", f"{folder}/a"],
        env=base_env(False, **ENV, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    import urllib.request

    import psutil

    try:
        for _ in range(450):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        code = ONE_RUN.replace('print("END"', 'import os, signal\nfor p in [%s]: os.kill(p, signal.SIGKILL)\nprint("END"')
        pids = [server.pid] + [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
        proc = python(code % ", ".join(map(str, pids)), shim=shim, timeout=600,
                      MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}")
        return time.monotonic() - figure(proc, "END")
    finally:
        for p in psutil.Process(server.pid).children(recursive=True) if server.poll() is None else []:
            p.kill()
        server.kill()
        server.wait()


def main():
    env_off = {"AUTOTEARDOWN_DISABLED_INTEGRATIONS": "mlflow"}
    cold, warm = medians(lambda v: figure(python(PATCH_COST, v, **env_off)), "cold", "wrapt-imported")
    line("patch applied at `import mlflow` (integration + wrapt imported)", cold)
    line("patch applied at `import mlflow`, wrapt already imported", warm)
    with tempfile.TemporaryDirectory() as folder:
        uri = f"sqlite:///{folder}/mlruns.db"
        recorded = statistics.median(figure(python(PER_RUN, uri)) for _ in range(3))
        line("what the start_run wrapper adds to each run (recording it)", recorded * 1e3, "µs")
        plain, shim = (1e3 * t for t in medians(lambda v: exit_time(uri, v), False, True))
        line("exit of a one-run script on sqlite: mlflow alone", plain)
        line("exit of a one-run script on sqlite: autoteardown", shim, extra=f"  (x{shim / plain:.2f})")
        if "--alone-server-gone" in sys.argv:
            line("exit, tracking server killed before it: autoteardown (10 s deadline)",
                 server_gone_exit(Path(folder, "s1"), True), "s")
            line("exit, tracking server killed before it: mlflow alone", server_gone_exit(Path(folder, "s2"), False), "s")


if __name__ == "__main__":
    main()
