"""A real `mlflow server` on 127.0.0.1 and sqlite stores, for the tests that need them."""

import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from helpers import base_env, free_port, in_session, kill_pids, wait_gone

ENV = {"MLFLOW_DISABLE_TELEMETRY": "true"}


TEMPLATE: "list[Path]" = []  # a sqlite store mlflow has already migrated (a fresh one costs ~1.5 s)


def sqlite_store(folder):
    """sqlite:///<folder>/mlruns.db: a copy of TEMPLATE's migrated store if a test module made
    one, else a new file that mlflow migrates on first use."""
    if TEMPLATE:
        shutil.copy(TEMPLATE[0], folder / "mlruns.db")
    return f"sqlite:///{folder}/mlruns.db"


class Server:
    """`mlflow server` on a free port, in a session of its own (jobs.popen); stop() kills it and
    its workers, and the jobs' cleanup whatever is left of its session."""

    def __init__(self, folder, jobs):
        self.db = folder / "mlruns.db"
        sqlite_store(folder)
        port = free_port()
        self.uri = f"http://127.0.0.1:{port}"
        self.log = open(folder / "server.log", "w")
        self.proc = jobs.popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{self.db}",
             "--default-artifact-root", str(folder / "artifacts")],
            env=base_env(shim=False, **ENV, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"), stdout=self.log,
            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(folder / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("mlflow server did not answer within 90 s")

    def processes(self):
        try:
            root = psutil.Process(self.proc.pid)
            return [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def signal(self, signum):
        for process in self.processes():
            try:
                process.send_signal(signum)
            except psutil.Error:
                pass

    def stop(self):
        # Its workers (uvicorn, the job runner) are its children, in its session.
        pids = sorted({p.pid for p in self.processes()} | set(in_session(self.proc.pid)))
        self.signal(signal.SIGCONT)
        kill_pids(pids)
        self.proc.wait(timeout=30)
        wait_gone(pids, within=10)
        self.log.close()
