"""Benchmarks: print numbers, assert nothing. Run: python tests/benchmark.py

- import cost of autoteardown (python -X importtime, bytecode cached), and the
  wall time of an interpreter start with and without it;
- the extra cost of a patched DataLoader.__iter__;
- exit time with 8 live DataLoader workers: the shim against calling
  _shutdown_workers() by hand, and against no teardown at all.
"""

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import ROOT, base_env  # noqa: E402

RUNS = 15


def py(code, shim=True, extra=()):
    """shim=True: autoteardown importable (but not auto-imported) from this checkout."""
    env = base_env(False, PYTHONPATH=str(ROOT) if shim else "")
    return subprocess.run([sys.executable, *extra, "-c", code], env=env,
                          capture_output=True, text=True, timeout=120)


def import_cost():
    # "with bytecode cached": compile it, since PYTHONDONTWRITEBYTECODE may be set.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "autoteardown")], check=True)
    own = []
    for _ in range(RUNS):
        err = py("import autoteardown", extra=("-X", "importtime")).stderr
        match = re.search(r"\|\s*(\d+) \| autoteardown$", err, re.M)
        own.append(int(match.group(1)) / 1000)
    bare, shim = [], []
    for _ in range(RUNS):
        t = time.perf_counter(); py("pass", shim=False); bare.append(time.perf_counter() - t)
        t = time.perf_counter(); py("import autoteardown"); shim.append(time.perf_counter() - t)
    return statistics.median(own), statistics.median(bare) * 1000, statistics.median(shim) * 1000


ITER_COST = """
import time, autoteardown, torch
from torch.utils.data import DataLoader
loader = DataLoader(list(range(8)), batch_size=2)
def per_call(n=20000):
    t = time.perf_counter()
    for _ in range(n):
        iter(loader)
    return (time.perf_counter() - t) / n * 1e6
per_call(2000)
patched = min(per_call() for _ in range(5))
autoteardown.uninstall()
plain = min(per_call() for _ in range(5))
print(patched, plain)
"""

EXIT_8 = """
import sys, time, torch
from torch.utils.data import DataLoader
loader = DataLoader(list(range(10000)), batch_size=4, num_workers=8)
batches = iter(loader)
for _ in range(20):
    next(batches)
if sys.argv[1] == "hand":
    t = time.monotonic(); batches._shutdown_workers()
    print("SHUTDOWN", time.monotonic() - t)
print("END", time.monotonic(), flush=True)
"""


def exit_time(mode):
    times = []
    for _ in range(5):
        proc = subprocess.run([sys.executable, "-c", EXIT_8, mode], env=base_env(mode == "shim"),
                              capture_output=True, text=True, timeout=120)
        ended = time.monotonic()
        end = float(re.search(r"^END (\S+)", proc.stdout, re.M).group(1))
        extra = re.search(r"^SHUTDOWN (\S+)", proc.stdout, re.M)
        times.append(ended - end + (float(extra.group(1)) if extra else 0.0))
    return statistics.median(times) * 1000


def main():
    own, bare, shim = import_cost()
    print(f"{'import autoteardown (-X importtime, cumulative)':<58}{own:8.2f} ms")
    print(f"{'interpreter start, bare':<58}{bare:8.1f} ms")
    print(f"{'interpreter start + import autoteardown':<58}{shim:8.1f} ms  (x{shim / bare:.2f})")
    patched, plain = map(float, py(ITER_COST).stdout.split())
    print(f"{'iter(DataLoader), patched':<58}{patched:8.2f} us")
    print(f"{'iter(DataLoader), unpatched':<58}{plain:8.2f} us  (+{patched - plain:.2f} us)")
    hand, shim_exit, none = exit_time("hand"), exit_time("shim"), exit_time("none")
    print(f"{'exit with 8 workers: _shutdown_workers() by hand':<58}{hand:8.0f} ms")
    print(f"{'exit with 8 workers: autoteardown':<58}{shim_exit:8.0f} ms  (x{shim_exit / hand:.2f} of by hand)")
    print(f"{'exit with 8 workers: no teardown':<58}{none:8.0f} ms")


if __name__ == "__main__":
    main()
