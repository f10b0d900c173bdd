"""Benchmark: the exit time of a one-run wandb script (offline), with and without
the shim. Prints numbers, asserts nothing. Run: python tests/benchmark_wandb.py

Exit time is from the script's last statement to the end of the process: without
the shim wandb's atexit hook finishes the run; with it, autoteardown does.
"""

import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import python  # noqa: E402

RUNS = 21

ONE_RUN = """
import time, wandb
run = wandb.init(project="benchmark")
for step in range(100):
    run.log({"loss": 1 / (step + 1)})
print("END", time.monotonic(), flush=True)
"""


def exit_time(shim):
    with tempfile.TemporaryDirectory() as wandb_dir:
        env = {"WANDB_DIR": wandb_dir, "WANDB_CACHE_DIR": Path(wandb_dir, "cache")}
        proc = python(ONE_RUN, shim=shim, env=env, timeout=120)
        ended = time.monotonic()
    return ended - float(re.search(r"^END (\S+)", proc.stdout, re.M).group(1))


def main():
    # Alternated, so that a busy machine slows both alike.
    times = {False: [], True: []}
    for _ in range(RUNS):
        for shim in times:
            times[shim].append(exit_time(shim))
    plain, shim = (statistics.median(times[s]) * 1000 for s in (False, True))
    print(f"{'exit of a one-run wandb script: wandb alone':<58}{plain:8.0f} ms")
    print(f"{'exit of a one-run wandb script: autoteardown':<58}{shim:8.0f} ms  (x{shim / plain:.2f})")


if __name__ == "__main__":
    main()
