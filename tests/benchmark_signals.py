"""Signal-path figures for the README (prints numbers; not a test). Runs the scripts of
tests/test_signals.py N times each (default 5): seconds from the first SIGTERM to the end
for two SIGTERMs 50 ms apart (StatefulDataLoader with 4 workers + a wandb run) and for a
script that swallows the SystemExit; pool.terminate() with a task stuck in C code; a raw
fork child stuck in C code dying of SIGTERM. Usage: python tests/benchmark_signals.py [N]
"""

import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
os.environ["AUTOTEARDOWN_DISABLE"] = "1"  # this process is never armed

from helpers import Jobs, wait_for_line  # noqa: E402


def signalled(mode, count, shim=True):
    jobs = Jobs(Path(tempfile.mkdtemp()))
    try:
        proc = jobs.start("signals_job.py", mode, shim=shim, AUTOTEARDOWN_TIMEOUT=4)
        _, before = wait_for_line(proc, "READY", timeout=120)
        sent = time.monotonic()
        for index in range(count):
            if index:
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
        result = jobs.finish(proc, timeout=60, before=before)
        return result.returncode, result.ended - sent
    finally:
        jobs.cleanup()


def scripted(mode, tag, *args):
    jobs = Jobs(Path(tempfile.mkdtemp()))
    try:
        result = jobs.run("signals_job.py", mode, *args, timeout=60)
        return result.stdout.split(f"{tag}:")[1].split()
    finally:
        jobs.cleanup()


def summary(values):
    return f"median {statistics.median(values):.2f}, max {max(values):.2f}"


def main(n):
    for shim in (True, False):
        ends = [signalled("twice", 2, shim) for _ in range(n)]
        print(f"two SIGTERMs, {'with' if shim else 'without'} the shim: statuses {sorted({c for c, _ in ends})}, "
              f"seconds to the end {summary([t for _, t in ends])}")
    ends = [signalled("swallow", 1) for _ in range(n)]
    print(f"SystemExit swallowed (AUTOTEARDOWN_TIMEOUT=4): statuses {sorted({c for c, _ in ends})}, "
          f"seconds to the end {summary([t for _, t in ends])}")
    with tempfile.TemporaryDirectory() as folder:
        pools = [float(scripted("pool", "TERMINATE", Path(folder) / f"started-{i}")[0]) for i in range(n)]
    print(f"fork Pool stuck in C code: pool.terminate() {summary(pools)} s")
    forks = [scripted("rawfork", "CHILD") for _ in range(n)]
    print(f"raw fork child stuck in C code: statuses {sorted({f[0] for f in forks})}, "
          f"seconds to die {summary([float(f[1]) for f in forks])}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
