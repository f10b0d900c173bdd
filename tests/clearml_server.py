"""A stand-in for a ClearML server's API on 127.0.0.1, for the tests (no ClearML server can
run here): it answers the calls the real clearml SDK makes well enough for it to run, and
records each call as one JSON line (endpoint, body) in a file the tests read.

A task's state exists only on its server: `tasks.started`, `tasks.completed`,
`tasks.failed`, `tasks.stopped` are the state changes; `events.add_batch` (json lines)
carries the scalars. Run as `python clearml_server.py PORT RECORDS` (its own process);
`Server` starts it from a test (jobs.popen) and reads what it recorded.
"""

import base64
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RECORDS = "clearml-calls.jsonl"  # in the test's folder
API_VERSION = "2.23"  # the newest the 2.1 client knows: it behaves as with a current server
STATES = {"started": "in_progress", "completed": "completed", "failed": "failed", "stopped": "stopped",
          "close": "closed", "reset": "created", "enqueue": "queued", "publish": "published"}


def _token():
    """An unsigned JWT (the SDK reads it without checking the signature): the API version."""
    def part(value):
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {"api_version": API_VERSION, "server_version": "2.3.0", "env": "test", "exp": int(time.time()) + 86400,
              "identity": {"user": "u", "company": "c"}}
    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2ln"


class Store:
    def __init__(self, records):
        self.lock = threading.Lock()
        self.records = open(records, "a")
        self.tasks, self.projects = {}, {}

    def record(self, endpoint, body):
        with self.lock:
            self.records.write(json.dumps({"at": time.time(), "endpoint": endpoint, "body": body}) + "\n")
            self.records.flush()

    def answer(self, endpoint, body):
        """The `data` of the answer to endpoint ("service.action")."""
        service, _, action = endpoint.partition(".")
        body = body if isinstance(body, dict) else {}
        with self.lock:
            if endpoint == "auth.login":
                return {"token": _token()}
            if endpoint == "projects.create":
                pid = uuid.uuid4().hex
                self.projects[pid] = {"id": pid, "name": body.get("name")}
                return {"id": pid}
            if service == "projects" and action.startswith("get_all"):
                names = body.get("name")
                found = [p for p in self.projects.values() if not names or _matches(p["name"], names)]
                return {"projects": found}
            if endpoint == "tasks.create":
                tid = uuid.uuid4().hex
                self.tasks[tid] = {"output": {}, "execution": {}, "script": {}, "hyperparams": {}, "configuration": {},
                                   "runtime": {}, "tags": [], "system_tags": [], **body, "id": tid,
                                   "status": "created", "last_iteration": 0}
                return {"id": tid}
            if endpoint == "tasks.get_by_id":
                return {"task": self.tasks.get(body.get("task"), {"id": body.get("task")})}
            if service == "tasks" and action.startswith("get_all"):
                ids = body.get("id") or []
                return {"tasks": [t for t in self.tasks.values() if not ids or t["id"] in ids]}
            task = self.tasks.get(body.get("task"))
            if service == "tasks" and task is not None:
                if action in STATES:
                    task["status"] = STATES[action]
                    task.setdefault("status_history", []).append(action)
                elif action == "edit":
                    task.update({k: v for k, v in body.items() if k not in ("task", "force")})
                return {"updated": 1, "fields": {"status": task["status"]}}
            if endpoint == "events.add_batch":
                return {"added": len(body.get("events", [])), "errors": 0}
            return {}


def _matches(name, pattern):
    return name == pattern or pattern.strip("^$").replace("\\", "") == name


class Handler(BaseHTTPRequestHandler):
    store: Store

    def _serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode(errors="replace") if length else ""
        endpoint = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
        if endpoint == "events.add_batch":  # json lines, one event each
            body = {"events": [json.loads(line) for line in raw.splitlines() if line.strip()]}
        else:
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {"raw": raw[:200]}
        self.store.record(endpoint, body)
        data = self.store.answer(endpoint, body)
        meta = {"id": uuid.uuid4().hex, "trx": uuid.uuid4().hex, "result_code": 200, "result_subcode": 0,
                "result_msg": "OK", "error_stack": "",
                "endpoint": {"name": endpoint, "requested_version": API_VERSION, "actual_version": API_VERSION}}
        payload = json.dumps({"meta": meta, "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = _serve

    def log_message(self, *args):
        pass


def main():
    port, records = int(sys.argv[1]), sys.argv[2]
    Handler.store = Store(records)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print("LISTENING", flush=True)
    server.serve_forever()


# ---- for the tests ----------------------------------------------------------------

class Server:
    """The stand-in on a free port, in a session of its own (jobs.popen); env() points the SDK
    at it (and at a config file in `folder`); calls() reads what it recorded; stop() kills it."""

    def __init__(self, folder, jobs):
        import subprocess

        from helpers import base_env, free_port

        self.folder, self.records = Path(folder), Path(folder) / RECORDS
        self.records.touch()
        self.uri = f"http://127.0.0.1:{free_port()}"
        self.proc = jobs.popen([sys.executable, __file__, self.uri.rsplit(":", 1)[1], str(self.records)],
                               env=base_env(shim=False), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING"):
            self.stop()
            raise RuntimeError(f"the ClearML stand-in did not start: {line}{self.proc.stdout.read()}")

    def env(self, sdk=""):
        """The client's environment: this server, and a config file in the folder (`sdk`: its
        sdk section's settings, "development.report_use_subprocess: false")."""
        config = self.folder / "clearml.conf"
        config.write_text(f"sdk {{ {sdk} }}\n")
        return {"CLEARML_API_HOST": self.uri, "CLEARML_WEB_HOST": self.uri, "CLEARML_FILES_HOST": self.uri,
                "CLEARML_API_ACCESS_KEY": "test", "CLEARML_API_SECRET_KEY": "test", "CLEARML_CONFIG_FILE": config,
                "CLEARML_CACHE_DIR": self.folder / "clearml-cache", "CLEARML_NO_DEFAULT_SERVER": "1",
                "HOME": self.folder}

    def calls(self):
        return self.read(self.folder)

    @staticmethod
    def read(folder):
        """The calls the stand-in of `folder` recorded, in order."""
        path = Path(folder) / RECORDS
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def stop(self):
        from helpers import kill_pids, wait_gone

        kill_pids([self.proc.pid])
        self.proc.wait(timeout=30)
        wait_gone([self.proc.pid], within=10)
        if self.proc.stdout:
            self.proc.stdout.close()


if __name__ == "__main__":
    main()
