"""Benchmarks: print a table, assert nothing. Run: python tests/benchmark.py

- import cost of autoteardown (python -X importtime, bytecode cached), and the
  wall time of an interpreter start with and without it;
- the extra cost of a patched DataLoader.__iter__;
- exit time with 8 live DataLoader workers: the shim against calling
  _shutdown_workers() by hand, and against no teardown at all;
- exit time of a script holding 8 DataLoader workers, 2 wandb runs (offline) and
  2 Ray actors (tests/scripts/bench_exit.py): the shim against a hand-written
  teardown of the same resources (with ray.shutdown(), and without it: Ray's exit hook
  then flushes the actors' logs for 0.5 s, as with the shim) and against the script
  just ending without the shim (alternated, so that a busy machine slows all alike);
- SIGTERM 0.3 s after a 100 MB async torch.distributed.checkpoint save, to the process
  gone (tests/scripts/checkpoint_job.py): the shim against the same script waiting for the
  save in its own SIGTERM handler (alternated);
- exit time of a script whose DataLoader items take 3 s each (tests/scripts/slow_items_job.py),
  ending or raising after its first batch: the shim against no shim (alternated);
- the registry after 10,000 iterators recorded and dropped: entries held and the
  memory allocated in registry.py (tracemalloc), against after 100 (it must not grow).

Every comparison is a ratio of two figures measured in the same run (medians).
"""

import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import ROOT, SCRIPTS, base_env, in_session, kill_pids, python  # noqa: E402

RUNS = 15
EXIT_RUNS = 5


def py(code, shim=True, extra=()):
    """shim=True: autoteardown importable (but not auto-imported) from this checkout."""
    return python([*extra, "-c", code], shim=False, pythonpath=ROOT if shim else None, timeout=120)


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
        t = time.perf_counter()
        py("pass", shim=False)
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        py("import autoteardown")
        shim.append(time.perf_counter() - t)
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
        proc = python(EXIT_8, mode, shim=mode == "shim", timeout=120)
        ended = time.monotonic()
        end = float(re.search(r"^END (\S+)", proc.stdout, re.M).group(1))
        extra = re.search(r"^SHUTDOWN (\S+)", proc.stdout, re.M)
        times.append(ended - end + (float(extra.group(1)) if extra else 0.0))
    return statistics.median(times) * 1000


def all_resources_exit_time():
    """Median exit time of bench_exit.py (from END to the end of the process, plus the
    hand-written teardown), its modes alternated."""
    times = {"hand": [], "shim": [], "none": [], "hand-flush": []}
    for _ in range(EXIT_RUNS):
        for mode in times:
            with tempfile.TemporaryDirectory() as wandb_dir:
                env = base_env(mode == "shim", WANDB_DIR=wandb_dir, WANDB_CACHE_DIR=Path(wandb_dir, "cache"))
                proc = subprocess.Popen([sys.executable, str(SCRIPTS / "bench_exit.py"), mode], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
                try:
                    out, _ = proc.communicate(timeout=300)
                finally:
                    kill_pids(in_session(proc.pid))  # Ray's processes, if any outlived it
                ended = time.monotonic()
            end = float(re.search(r"^END: (\S+)", out, re.M).group(1))
            teardown = re.search(r"^TEARDOWN: (\S+)", out, re.M)
            times[mode].append(ended - end + (float(teardown.group(1)) if teardown else 0.0))
    return [statistics.median(times[mode]) * 1000 for mode in ("hand", "shim", "none", "hand-flush")]


def checkpoint_sigterm_time():
    """Median seconds from a SIGTERM mid-save to the process gone: (shim, by hand)."""
    times = {"sigterm": [], "hand": []}
    for _ in range(EXIT_RUNS):
        for mode in times:
            with tempfile.TemporaryDirectory() as folder:
                proc = subprocess.Popen([sys.executable, str(SCRIPTS / "checkpoint_job.py"), folder, mode],
                                        env=base_env(mode == "sigterm"), stdout=subprocess.PIPE, text=True)
                for line in proc.stdout:  # to READY (or the end, should the script fail)
                    if line.startswith("READY"):
                        break
                time.sleep(0.3)
                sent = time.monotonic()
                proc.terminate()
                proc.communicate(timeout=120)
                times[mode].append(time.monotonic() - sent)
    return statistics.median(times["sigterm"]) * 1000, statistics.median(times["hand"]) * 1000


def slow_items_exit_time(ending):
    """Median exit time (END to the end of the process) of slow_items_job.py: (shim, none)."""
    times = {True: [], False: []}
    for _ in range(EXIT_RUNS):
        for shim in times:
            proc = python([SCRIPTS / "slow_items_job.py", "3", ending], shim=shim, timeout=120)
            ended = time.monotonic()
            times[shim].append(ended - float(re.search(r"^END: (\S+)", proc.stdout, re.M).group(1)))
    return statistics.median(times[True]) * 1000, statistics.median(times[False]) * 1000


REGISTRY_MEMORY = """
import collections, gc, tracemalloc, torch
from torch.utils.data import DataLoader
from autoteardown import registry
loader = DataLoader(list(range(8)), batch_size=2)
def held():
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, registry.__file__)])
    return registry.size(), sum(stat.size for stat in snapshot.statistics("filename"))
tracemalloc.start()
# Recorded as the patched _get_iterator records a worker iterator (10,000 with real
# workers would be 10,000 processes), and dropped 50 iterators later (so that the
# registry sees many ids, not one reused address).
window = collections.deque(maxlen=50)
for count in range(1, 10_001):
    window.append(iter(loader))
    registry.record("dataloader", window[-1])
    if count == 100:
        print(*held())
print(*held())
"""


def registry_memory():
    lines = py(REGISTRY_MEMORY).stdout.split("\n")
    return [tuple(map(int, line.split())) for line in lines[:2]]


def table(rows):
    """A Markdown table: what, figure, and the ratio to what it is compared with."""
    width = [max(len(row[i]) for row in rows + [("what", "figure", "ratio")]) for i in range(3)]
    print(f"| {'what':<{width[0]}} | {'figure':>{width[1]}} | {'ratio':<{width[2]}} |")
    print(f"| {'-' * width[0]} | {'-' * (width[1] - 1)}: | {'-' * width[2]} |")
    for what, figure, ratio in rows:
        print(f"| {what:<{width[0]}} | {figure:>{width[1]}} | {ratio:<{width[2]}} |", flush=True)


def main():
    rows = []
    own, bare, shim = import_cost()
    rows.append(("import autoteardown (-X importtime, cumulative)", f"{own:.2f} ms", ""))
    rows.append(("interpreter start, bare", f"{bare:.1f} ms", ""))
    rows.append(("interpreter start + import autoteardown", f"{shim:.1f} ms", f"x{shim / bare:.2f} of bare"))
    patched, plain = map(float, py(ITER_COST).stdout.split())
    rows.append(("iter(DataLoader), patched", f"{patched:.2f} us", f"x{patched / plain:.2f} of unpatched"))
    rows.append(("iter(DataLoader), unpatched", f"{plain:.2f} us", f"+{patched - plain:.2f} us patched"))
    hand, shim_exit, none = exit_time("hand"), exit_time("shim"), exit_time("none")
    rows.append(("exit with 8 workers: _shutdown_workers() by hand", f"{hand:.0f} ms", ""))
    rows.append(("exit with 8 workers: autoteardown", f"{shim_exit:.0f} ms", f"x{shim_exit / hand:.2f} of by hand"))
    rows.append(("exit with 8 workers: no teardown", f"{none:.0f} ms", f"x{none / hand:.2f} of by hand"))
    hand_all, shim_all, none_all, flush_all = all_resources_exit_time()
    rows.append(("exit, 8 workers + 2 wandb runs + 2 Ray actors: by hand", f"{hand_all:.0f} ms", ""))
    rows.append(("exit, 8 workers + 2 wandb runs + 2 Ray actors: autoteardown", f"{shim_all:.0f} ms",
                 f"x{shim_all / hand_all:.2f} of by hand"))
    rows.append(("exit, 8 workers + 2 wandb runs + 2 Ray actors: no shim, no teardown", f"{none_all:.0f} ms",
                 f"x{none_all / hand_all:.2f} of by hand"))
    rows.append(("the same by hand, ray.shutdown() left to Ray's exit hook (its 0.5 s log flush)",
                 f"{flush_all:.0f} ms", f"autoteardown x{shim_all / flush_all:.2f} of it"))
    for ending in ("normal", "raise"):
        shim_slow, none_slow = slow_items_exit_time(ending)
        rows.append((f"exit, 2 workers loading 3 s items ({ending} end): autoteardown", f"{shim_slow:.0f} ms",
                     f"x{shim_slow / none_slow:.2f} of no shim"))
        rows.append((f"exit, 2 workers loading 3 s items ({ending} end): no shim", f"{none_slow:.0f} ms", ""))
    shim_save, hand_save = checkpoint_sigterm_time()
    rows.append(("SIGTERM mid-save (100 MB async checkpoint) to process gone: autoteardown", f"{shim_save:.0f} ms",
                 f"x{shim_save / hand_save:.2f} of by hand"))
    rows.append(("the same, the script's own SIGTERM handler waiting for the save", f"{hand_save:.0f} ms", ""))
    (entries_100, bytes_100), (entries_10k, bytes_10k) = registry_memory()
    rows.append(("registry after 100 iterators recorded and dropped", f"{entries_100} entries", f"{bytes_100 / 1024:.1f} KiB"))
    rows.append(("registry after 10,000 iterators recorded and dropped", f"{entries_10k} entries",
                 f"{bytes_10k / 1024:.1f} KiB (x{bytes_10k / bytes_100:.2f} of 100)"))
    table(rows)


if __name__ == "__main__":
    main()
