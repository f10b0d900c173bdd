"""Run small unmodified scripts in subprocesses, with or without the shim."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
SITECUSTOMIZE = ROOT / "sitecustomize_example"


def base_env(shim=True, **extra):
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("AUTOTEARDOWN_"):
            del env[key]
    env["PYTHONPATH"] = os.pathsep.join([str(SITECUSTOMIZE), str(ROOT)]) if shim else ""
    env["WANDB_MODE"] = "offline"
    env["WANDB_SILENT"] = "true"
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["PYTHONWARNINGS"] = "ignore"
    env["PYTHONUNBUFFERED"] = "1"
    env["GLOO_SOCKET_IFNAME"] = "lo"  # torch.distributed tests stay on loopback
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Run:
    def __init__(self, proc, stdout, stderr, elapsed):
        self.pid = proc.pid  # also the id of the session the script leads (start_new_session)
        self.returncode = proc.returncode
        self.stdout = stdout
        self.stderr = stderr
        self.elapsed = elapsed

    def pids(self, tag="PIDS"):
        """Pids the script printed as 'TAG: 1 2 3'."""
        found = []
        for line in self.stdout.splitlines():
            if line.startswith(tag + ":"):
                found += [int(p) for p in line.split(":", 1)[1].split()]
        return found

    def __repr__(self):
        return f"<Run rc={self.returncode} {self.elapsed:.1f}s\n--stdout--\n{self.stdout}\n--stderr--\n{self.stderr}>"


def start(script, *args, shim=True, env=None, cwd=None):
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), *map(str, args)],
        env=base_env(shim, **(env or {})), cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def finish(proc, timeout=90, started=None):
    started = started or time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"script hung for {timeout}s\n{out}\n{err}")
    return Run(proc, out, err, time.monotonic() - started)


def run(script, *args, shim=True, env=None, timeout=90, cwd=None):
    started = time.monotonic()
    return finish(start(script, *args, shim=shim, env=env, cwd=cwd), timeout, started)


def wait_for_line(proc, prefix, timeout=60):
    """Read stdout until a line starting with prefix; return it."""
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(prefix):
            return line, "".join(lines)
    kill_tree(proc.pid)
    raise AssertionError(f"no {prefix!r} line; got {''.join(lines)!r}; stderr {proc.stderr.read()!r}")


def alive(pids):
    """The pids among these that are still running (zombies count as gone)."""
    result = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                result.append(pid)
        except psutil.NoSuchProcess:
            pass
    return result


def wait_until_empty(probe, within):
    """Call probe() until it returns an empty list or `within` seconds pass; its last answer."""
    deadline = time.monotonic() + within
    while probe() and time.monotonic() < deadline:
        time.sleep(0.05)
    return probe()


def wait_gone(pids, within):
    return wait_until_empty(lambda: alive(pids), within)


def kill_pids(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(pid):
    try:
        procs = psutil.Process(pid).children(recursive=True) + [psutil.Process(pid)]
    except psutil.NoSuchProcess:
        return
    kill_pids([p.pid for p in procs])


def in_session(sid):
    """Pids of the live processes of session `sid` (each script started here leads its own):
    every descendant that did not start a session of its own, reported or not."""
    found = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getsid(process.pid) == sid and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except (OSError, psutil.Error):
            pass
    return found


def wait_session_gone(sid, within):
    return wait_until_empty(lambda: in_session(sid), within)


def tracebacks(stderr):
    return len(re.findall(r"^Traceback \(most recent call last\)", stderr, re.M))


EXIT_NOISE = ("killed by signal", "Exception ignored", "ConnectionResetError", "BrokenPipeError")


def noise(stderr):
    return [n for n in EXIT_NOISE if n in stderr]
