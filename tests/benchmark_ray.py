"""Ray benchmarks: print numbers, assert nothing. Run: python tests/benchmark_ray.py

- time from __ray_terminate__ to a dead process for actors whose teardown
  hangs (the goal: the grace period + 1 s at most);
- driver exit time of the verl-style TaskRunner script, with and without the shim.
"""

import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import SCRIPTS, base_env, kill_pids  # noqa: E402

RUNS = 3


def script(name, *args, shim, **env):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPTS / name), *args], env=base_env(shim, **env),
                          capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - started, time.monotonic()


def pids(out, tag):
    match = re.search(rf"^{tag}:(.*)$", out, re.M)
    return [int(p) for p in match.group(1).split()] if match else []


def reap_time(grace):
    times = []
    for _ in range(RUNS):
        proc, _, _ = script("ray_hung_actors.py", "off", shim=True, AUTOTEARDOWN_RAY_GRACE_S=grace)
        kill_pids(pids(proc.stdout, "PIDS") + pids(proc.stdout, "BYSTANDER"))
        times.append(float(re.search(r"^GONE_AFTER: (\S+)", proc.stdout, re.M).group(1)))
    return statistics.median(times)


def driver_exit(shim):
    times = []
    for _ in range(RUNS):
        with tempfile.TemporaryDirectory() as folder:
            proc, _, ended = script("ray_task_runner.py", "end", shim=shim, WANDB_DIR=folder,
                                    WANDB_CACHE_DIR=folder + "/cache")
            kill_pids(pids(proc.stdout, "ACTOR") + pids(proc.stdout, "CHILDREN"))
            end = float(re.search(r"^END: (\S+)", proc.stdout, re.M).group(1))
            times.append(ended - end)
    return statistics.median(times)


def main():
    for grace in ("2", "5"):
        print(f"{'__ray_terminate__ -> hung actor dead, grace ' + grace + ' s':<58}{reap_time(grace):8.2f} s")
    with_shim, without = driver_exit(True), driver_exit(False)
    print(f"{'TaskRunner driver exit, autoteardown':<58}{with_shim:8.2f} s")
    print(f"{'TaskRunner driver exit, no shim (loses the wandb run)':<58}{without:8.2f} s  "
          f"(x{with_shim / without:.2f})")


if __name__ == "__main__":
    main()
