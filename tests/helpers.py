"""Run small unmodified scripts in subprocesses, with or without the shim.

The one scaffolding of the suite: base_env() for every subprocess, start()/finish()/run()
for the scripts, python() for code (or a module) in a fresh interpreter, one parser of the
"TAG: pid pid" lines the scripts print (reported()), one Jobs helper that kills whatever its
scripts, or any command it started (Jobs.popen), left behind (the `jobs` fixture in
conftest.py), one free_port(). Processes are killed by pid, never by name."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
SITECUSTOMIZE = ROOT / "sitecustomize_example"

# Every timing bound in a test is a configured deadline or grace plus this margin, which
# holds on a loaded 2-core machine (TESTS_LOAD_MARGIN widens it). Waits poll: a wide bound
# costs nothing when things go right.
LOAD_MARGIN = float(os.environ.get("TESTS_LOAD_MARGIN", "5"))


_ray_tmpdir = None


def ray_tmpdir():
    """This test run's own Ray temp dir (RAY_TMPDIR), short enough for Ray's socket paths.
    `ray.init()` joins any cluster whose address it finds in its temp dir
    (ray_current_cluster): with a dir of its own, a run never joins another's Ray."""
    global _ray_tmpdir
    if _ray_tmpdir is None:
        _ray_tmpdir = tempfile.mkdtemp(prefix="at-ray-", dir="/tmp")
    return _ray_tmpdir


def remove_ray_tmpdir():
    if _ray_tmpdir is not None:
        shutil.rmtree(_ray_tmpdir, ignore_errors=True)


def base_env(shim=True, **extra):
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("AUTOTEARDOWN_"):
            del env[key]
    env["RAY_TMPDIR"] = os.environ.get("RAY_TMPDIR") or ray_tmpdir()
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
        return reported(self.stdout, tag)

    def __repr__(self):
        return f"<Run rc={self.returncode} {self.elapsed:.1f}s\n--stdout--\n{self.stdout}\n--stderr--\n{self.stderr}>"


def reported(text, tag="PIDS"):
    """The pids printed as 'TAG: 1 2 3' lines in text, in order (every such line).

    Not anchored at the start of a line: processes sharing one stdout (spawned ranks,
    Ray workers' forwarded output) can interleave their lines."""
    found = []
    for match in re.finditer(rf"(?:^|[^A-Z_]){re.escape(tag)}:([ \t\d]*)", text, re.M):
        found += [int(p) for p in match.group(1).split()]
    return found


_ports_given = set()
_ports_lock = threading.Lock()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago, never the same twice in
    this process (the kernel may hand a freed ephemeral port out again)."""
    with _ports_lock:
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _ports_given:
                _ports_given.add(port)
                return port
    raise RuntimeError("no free port")


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
        kill_pids(in_session(proc.pid))  # orphans (reparented) that still hold its pipes
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"script hung for {timeout}s\n{out}\n{err}") from None
    return Run(proc, out, err, time.monotonic() - started)


def run(script, *args, shim=True, env=None, timeout=90, cwd=None):
    started = time.monotonic()
    return finish(start(script, *args, shim=shim, env=env, cwd=cwd), timeout, started)


def python(code_or_args, *args, shim=True, env=None, timeout=90, input=None, pythonpath=None, launcher=(),
           cwd=None):
    """Run a fresh interpreter (sys.executable) to its end: its subprocess.CompletedProcess,
    stdout and stderr captured as text; subprocess.TimeoutExpired after `timeout` seconds.

    code_or_args: the code for `-c` (a str), or the interpreter's own arguments (a list:
    ["-m", "autoteardown", "doctor"], ["-i"], [script, ...]); `args` follow it (sys.argv[1:]).
    shim, env: its environment, base_env(shim, **env); pythonpath: entries put on PYTHONPATH
    after the shim's (shim=True), or alone (shim=False: pythonpath=ROOT, autoteardown importable
    but not activated). launcher: the command that starts the interpreter (autoteardown-run).
    input: its standard input (else this process's)."""
    command = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
    environ = base_env(shim, **(env or {}))
    if pythonpath is not None:
        entries = [pythonpath] if isinstance(pythonpath, (str, os.PathLike)) else list(pythonpath)
        environ["PYTHONPATH"] = os.pathsep.join([*filter(None, [environ["PYTHONPATH"]]), *map(str, entries)])
    return subprocess.run([*map(str, launcher), sys.executable, *map(str, command), *map(str, args)],
                          env=environ, cwd=cwd, input=input, capture_output=True, text=True, timeout=timeout)


def read_lines(proc, until, timeout):
    """Read proc's stdout until a line for which until(line) is true, its end, or `timeout`: (the lines
    read, the line that matched or None). A readline blocks until the script writes: the lines are
    read in a thread, and at the timeout the script's tree is killed, which ends that read."""
    lines, matched = [], []

    def read():
        for line in iter(proc.stdout.readline, ""):
            lines.append(line)
            if until(line):
                matched.append(line)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        kill_tree(proc.pid)
        kill_pids(in_session(proc.pid))  # orphans that still hold its stdout
        reader.join(30)
    return lines, (matched[0] if matched else None)


def wait_for_line(proc, prefix, timeout=60):
    """Read stdout until a line starting with prefix; return it and what was read."""
    lines, line = read_lines(proc, lambda line: line.startswith(prefix), timeout)
    if line is not None:
        return line, "".join(lines)
    kill_tree(proc.pid)
    try:
        _, stderr = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # held open by a process in a session of its own
        stderr = "(still held open)"
    raise AssertionError(f"no {prefix!r} line; got {''.join(lines)!r}; stderr {stderr!r}")


def read_until(proc, pattern, timeout=180):
    """Read stdout until a line matching `pattern` (re.search), its end or `timeout`: the text read."""
    return "".join(read_lines(proc, lambda line: re.search(pattern, line), timeout)[0])


def wait_for_ranks(proc, ranks=2, timeout=180):
    """Read a torchrun job's stdout until each rank has printed "READY <rank>"; the lines read."""
    ready = set()

    def all_ready(line):
        if line.startswith("READY"):
            ready.add(line.split()[1])
        return len(ready) >= ranks

    seen, _ = read_lines(proc, all_ready, timeout)
    assert ready == {str(rank) for rank in range(ranks)}, ("".join(seen), proc.poll())
    return seen


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


def scancel(pid, everyone=True):
    """SLURM's stop: SIGTERM to the process and every descendant at once, whatever their session
    (or to the process alone); the pids of the job, as they were just before."""
    job = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    for each in job if everyone else job[:1]:
        try:
            os.kill(each, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return job


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


# The tags under which the scripts report the processes they (or the libraries) started.
PID_TAGS = ("PIDS", "CORE", "ACTOR", "ACTOR_CHILDREN", "CHILDREN", "BYSTANDER", "PID")


class Jobs:
    """Scripts started for one test, in one WANDB_DIR (a tmp_path). At cleanup() whatever is
    left in their sessions, and every process they reported (PID_TAGS, or track()), is killed:
    by pid, through psutil, which refuses a pid that was reused since it was seen."""

    def __init__(self, folder=None):
        self.dir = folder
        self.sessions = []
        self.processes = []

    def env(self, **extra):
        env = {"WANDB_DIR": self.dir, "WANDB_CACHE_DIR": self.dir / "cache"} if self.dir else {}
        return {**env, **extra}

    def start(self, script, *args, shim=True, env=None, **extra):
        proc = start(script, *args, shim=shim, env=self.env(**(env or {}), **extra))
        self.sessions.append(proc.pid)
        return proc

    def popen(self, args, **popen_kwargs):
        """subprocess.Popen(args, **popen_kwargs) of any command, in a session of its own,
        killed at cleanup() like a script of start() (env, pipes: as given, nothing added)."""
        proc = subprocess.Popen(args, start_new_session=True, **popen_kwargs)
        self.sessions.append(proc.pid)
        return proc

    def finish(self, proc, timeout=120, started=None, before=""):
        """The Run of proc (its stdout prefixed with what was already read, `before`)."""
        try:
            result = finish(proc, timeout, started)
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
        result.stdout = before + result.stdout
        result.ended = time.monotonic()
        self.track_reported(result.stdout)
        return result

    def run(self, script, *args, timeout=120, **kwargs):
        started = time.monotonic()
        return self.finish(self.start(script, *args, **kwargs), timeout, started)

    def track_reported(self, text):
        self.track([pid for tag in PID_TAGS for pid in reported(text, tag)])

    def track(self, pids):
        for pid in pids:
            try:
                self.processes.append(psutil.Process(pid))
            except psutil.Error:
                pass

    def runs(self):
        """(run name, history steps, exit codes) of each wandb run file in self.dir, sorted."""
        from wandb_records import exit_codes, history_steps, records, run_files

        found = []
        for recs in map(records, run_files(self.dir)):
            name = [r.run.display_name for r in recs if r.HasField("run")][:1] or [None]
            found.append((name[0], history_steps(recs), exit_codes(recs)))
        return sorted(found, key=repr)

    def cleanup(self):
        for sid in self.sessions:
            kill_pids(in_session(sid))
        for process in self.processes:
            try:
                process.kill()  # psutil checks the pid still names the process it saw
            except psutil.Error:
                pass


def tracker_job(jobs, library, what, ending, shim=True, timeout=120, **env):
    """tests/scripts/tracker_job.py, offline and in jobs.dir; "sigterm": SIGTERM once READY."""
    env = {"TRACKER_DIR": jobs.dir, "TRACKIO_DIR": jobs.dir, "SWANLAB_MODE": "offline",
           "SWANLAB_ROOT": jobs.dir / "swanlab-root", **env}
    args = ("tracker_job.py", library, what, ending)
    if ending != "sigterm":
        return jobs.run(*args, shim=shim, env=env, timeout=timeout)
    proc = jobs.start(*args, shim=shim, env=env)
    _, before = wait_for_line(proc, "READY")
    proc.send_signal(signal.SIGTERM)
    return jobs.finish(proc, timeout=timeout, before=before)


def fake_distribution(folder, name, version):
    """PYTHONPATH for the shim with a dist-info that importlib.metadata finds first."""
    fake = folder / "fake" / f"{name}-{version}.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return os.pathsep.join(map(str, [fake.parent, SITECUSTOMIZE, ROOT]))


def ended_quietly(result, status, traces=0):
    """The script ended with `status`, printed `traces` tracebacks (the user's own), no exit
    noise and no line of ours."""
    assert result.returncode == status, result
    assert tracebacks(result.stderr) == traces and noise(result.stderr) == [], result
    assert "autoteardown:" not in result.stderr, result


def tracebacks(stderr):
    return len(re.findall(r"^Traceback \(most recent call last\)", stderr, re.M))


EXIT_NOISE = ("killed by signal", "Exception ignored", "ConnectionResetError", "BrokenPipeError")


def noise(stderr):
    return [n for n in EXIT_NOISE if n in stderr]
