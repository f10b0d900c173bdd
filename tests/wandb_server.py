"""A W&B server stand-in for the tests, in a process of its own on 127.0.0.1: enough of the
API (GraphQL's Viewer, UpsertBucket, ServerFeaturesQuery, CreateRunFiles and the queries it does
not know, answered empty; a run's file_stream; file uploads) for the real wandb-core to run
online against it, on the wandb range the project supports.

It records what reached it, one JSON line per request in RECORD: {"op": the GraphQL operation,
or "file_stream", "upload", "other"; "run": the run id; for file_stream, "history" (the history
lines it carried, as sent), "complete" and "exitcode"}. A test reads them back (`received`).

Its mode is a file, MODE (read at each request and each accept), so a test switches it while a
job runs: "answer" (the default), "stall" (accept, read, never answer: a server that hangs),
"slow N" (answer each request N seconds after it came: a server that is slow but answers), or
"gone" (stop listening: connections are refused; "answer" listens again on the same port).

Usage: python wandb_server.py PORT RECORD MODE
"""

import json
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENTITY = "autoteardown"
_record_lock = threading.Lock()


def mode(path):
    try:
        with open(path) as f:
            return f.read().strip() or "answer"
    except OSError:
        return "answer"


def received(record_path):
    """What the stand-in recorded: a list of dicts, in order."""
    try:
        with open(record_path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def history_steps(record_path, run_id=None):
    """The `_step` of each history line that reached the stand-in (for one run, or all), sorted."""
    steps = []
    for entry in received(record_path):
        if entry.get("op") == "file_stream" and (run_id is None or entry.get("run") == run_id):
            steps += [json.loads(line).get("_step") for line in entry.get("history", [])]
    return sorted(step for step in steps if step is not None)


def exit_codes(record_path, run_id=None):
    return [entry["exitcode"] for entry in received(record_path) if entry.get("op") == "file_stream"
            and entry.get("complete") and (run_id is None or entry.get("run") == run_id)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "wandb-stand-in"

    def log_message(self, *args):
        pass

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        if self.headers.get("Content-Encoding") == "gzip":
            import gzip

            data = gzip.decompress(data)
        return data

    def _answer(self, payload, status=200):
        out = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def _stall_or_go_on(self):
        """In "stall" mode, hold the request unanswered until the mode changes (then answer it);
        in "slow N" mode, for N seconds."""
        now = mode(self.server.mode_path)
        if now.startswith("slow "):
            time.sleep(float(now.split()[1]))
        while mode(self.server.mode_path) == "stall":
            time.sleep(0.1)

    def _record(self, entry):
        with _record_lock, open(self.server.record_path, "a") as out:
            out.write(json.dumps(entry) + "\n")

    def do_GET(self):
        self._stall_or_go_on()
        self._answer({})

    def do_PUT(self):
        self._body()
        self._stall_or_go_on()
        self._record({"op": "upload", "path": self.path})
        self._answer({})

    def do_POST(self):
        body = self._body()
        self._stall_or_go_on()
        path = self.path.split("?")[0]
        if path.startswith("/graphql"):
            return self._graphql(body)
        match = re.match(r"/files/([^/]+)/([^/]+)/([^/]+)/file_stream", path)
        if match:
            return self._file_stream(match.group(3), body)
        if path.startswith("/upload/"):
            self._record({"op": "upload", "path": path})
            return self._answer({})
        self._record({"op": "other", "path": path})
        return self._answer({})

    def _file_stream(self, run_id, body):
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            data = {}
        history = (data.get("files") or {}).get("wandb-history.jsonl") or {}
        self._record({"op": "file_stream", "run": run_id, "history": history.get("content") or [],
                      "complete": bool(data.get("complete")), "exitcode": data.get("exitcode")})
        self._answer({"exitcode": None, "limits": {}})

    def _graphql(self, body):
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = {}
        op = request.get("operationName") or ""
        variables = request.get("variables") or {}
        run_id = variables.get("name") or variables.get("run") or variables.get("runName")
        self._record({"op": op, "run": run_id})
        port = self.server.server_address[1]
        if op == "Viewer":
            data = {"viewer": {"id": "VXNlcjox", "entity": ENTITY, "username": ENTITY, "flags": "{}",
                               "teams": {"edges": []}}}
        elif op == "UpsertBucket":
            project = variables.get("modelName") or variables.get("project") or "uncategorized"
            entity = variables.get("entityName") or variables.get("entity") or ENTITY
            data = {"upsertBucket": {"inserted": True, "bucket": {
                "id": f"UnVuOi{run_id}", "name": run_id, "displayName": variables.get("displayName") or run_id,
                "description": None, "config": "{}", "sweepName": None, "historyLineCount": 0,
                "eventsLineCount": 0, "summaryMetrics": "{}", "tags": [], "sweep": None,
                "project": {"id": "UHJvamVjdDox", "name": project, "entity": {"id": "RW50aXR5OjE=", "name": entity}}}}}
        elif op == "CreateRunFiles":
            files = variables.get("files") or []
            data = {"createRunFiles": {"runID": f"UnVuOi{run_id}", "uploadHeaders": [], "files": [
                {"name": name, "uploadUrl": f"http://127.0.0.1:{port}/upload/{run_id}/{name}"} for name in files]}}
        elif op == "ServerFeaturesQuery":
            data = {"serverInfo": {"features": []}}
        else:
            data = {}
        self._answer({"data": data})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # a client that went away mid-request (wandb-core killed): nothing to report


def serve(port, record_path, mode_path):
    """Serve until killed; in "gone" mode the listening socket is closed, and opened again after."""
    while True:
        while mode(mode_path) == "gone":
            time.sleep(0.05)
        server = Server(("127.0.0.1", port), Handler)
        server.record_path, server.mode_path = record_path, mode_path
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        while mode(mode_path) != "gone":
            time.sleep(0.05)
        server.shutdown()
        server.server_close()  # refused from now on


def wait_listening(port, within=30.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3])
