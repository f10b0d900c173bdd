"""One guard a node a job: when an actor's process is gone, by any ending, so is every process it started.

The rule: when an actor's process ends, no process it started is left running. Its descendants,
however deep and whatever their session or process group, get SIGTERM once the actor is gone (an
engine releases its devices in its own handler; the actor's own teardown still had them) and
SIGKILL AUTOTEARDOWN_RAY_GRACE_S later. A process is the actor's if it was under the actor by
parent chain when it was last looked at, or if it carries the actor's id in its environment
(MARKER: set in the actor before its first method, inherited by whatever it starts, and kept by a
process its parent's death left with PID 1), and in both cases was created after the actor (and,
for the id, before it was gone: a restarted actor keeps its id). The guard is never an actor's
(GUARD is its MARKER). Every signal first checks the process's creation time, so a reused pid is
never signalled.

Who applies it: the guard of the actor's job on the actor's node, a process in a session of its
own (started through a shell that exits at once: Ray SIGKILLs an exiting actor's direct children),
and no one else. An actor registers with it (`watch`) when it first records something or starts a
process; whoever ends an actor hands the ending to it (`end_request`: through a zero-CPU task from
another node), and it adopts an actor that had not registered. The guard holds a pidfd of each
actor, so it learns of every ending the same way: the actor ends, crashes, is SIGKILLed or
`ray.kill`ed, or its driver goes. An actor that begins its teardown, or its ender, says when it
must be gone (`due`), and the guard kills it then if it is still there; it answers each ender once
the actor's processes are ended. It ignores SIGTERM and SIGINT (a scheduler's stop reaches every
process at once: it outlives the actors to end their trees) and exits when it has no actor, tree or
ender left. Each process gets one SIGTERM (a handler may take a second one as "stop now"). Its
socket's name is abstract, keyed on the user, the Ray node and the job, so that two jobs never
share one.

Ray SIGKILLs an exiting actor's direct children itself; its per-worker process groups
(RAY_process_group_cleanup_enabled) miss anything started in a new session. What is left is ours.

`_make()` builds the functions so that cloudpickle ships them by value: they also run in a
zero-CPU task on the actor's node, where autoteardown may not be installed; a guard runs this
module's source, handed to it as a value.
"""

import os
import signal
import threading
import time

try:
    from ..processes import terminate
except ImportError:  # the guard's script: processes.py's code comes ahead of this module's (`source`)
    pass

MARKER = "AUTOTEARDOWN_INTERNAL_RAY_ACTOR"
GUARD = "guard"  # MARKER's value in the guard's process: no actor id
LINGER_S = 1.0  # an idle guard waits this long for a new actor before it exits


def mark(actor_id: str) -> None:
    """In the actor: what it starts from now on carries its id (the environment is inherited)."""
    os.environ[MARKER] = actor_id


def _make():
    def same_worker(pid, not_after):
        """Is `pid` still the Ray worker that existed at `not_after`?"""
        import psutil

        try:
            process = psutil.Process(pid)
            command = " ".join(process.cmdline())
            # A reused pid belongs to a process created after the request.
            return not (process.create_time() > not_after or process.status() == psutil.STATUS_ZOMBIE or (
                "ray::" not in command and "default_worker.py" not in command))
        except psutil.Error:
            return False

    def clock():
        """Now, on the clock of psutil's creation times (boot time, whole seconds, plus uptime):
        a process started after a reading never shows an earlier creation time, as it can against
        time.time()."""
        import time

        import psutil

        try:
            return psutil.boot_time() + time.clock_gettime(time.CLOCK_BOOTTIME)
        except (AttributeError, OSError):  # no CLOCK_BOOTTIME (not Linux)
            return time.time()

    def descendants(pid, not_after, actor_id=None, known=(), gone_at=None):
        """(pid, creation time) of the actor's processes (the module's rule) and of `known` (an
        earlier look); the actor is `pid` if it existed at `not_after`. A marked process created
        after `gone_at` (when the actor was seen gone, on `clock()`) is a restarted actor's (same
        id), not its."""
        import psutil

        found = dict(known)
        born = 0.0
        try:
            root = psutil.Process(pid)
            if root.create_time() <= not_after:  # not a reused pid
                born = root.create_time()
                for child in root.children(recursive=True):
                    try:
                        if child.environ().get(MARKER) != GUARD:
                            found[child.pid] = child.create_time()
                    except psutil.Error:
                        pass
        except psutil.Error:  # gone: its id and the earlier look tell its processes
            pass
        if actor_id:
            for process in psutil.process_iter():
                try:
                    created = process.create_time()
                    # Creation times are whole clock ticks (10 ms): one tick before `gone_at` is after it.
                    if process.pid == pid or process.pid in found or created < born or (
                            gone_at is not None and created > gone_at - 0.01):
                        continue
                    if process.environ().get(MARKER) == actor_id:
                        found[process.pid] = created
                except psutil.Error:
                    pass
        return sorted(found.items())

    def guard_name(node_id, actor_id):
        """The guard's abstract socket: this user's, the node's (its Ray node id: every party knows it, the
        actor gone or not), the job's (an actor id ends with it)."""
        import os

        return f"\0autoteardown-guard-{os.getuid()}-{node_id}-{actor_id[-8:]}"

    def start_guard(name, source):
        """In the background, by a shell that exits at once, in a session of its own, marked as the guard
        (so no actor's process), without `site` (-S), so that no sitecustomize, and no autoteardown, slows
        it. Its code is this module's `source`, handed over as a value: a node may not have autoteardown.
        Two parties may start one each at once: the second cannot take the name, and exits."""
        import os
        import subprocess
        import sys

        env = {**os.environ, MARKER: GUARD}
        env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)  # psutil's, without site
        try:
            subprocess.run(["/bin/sh", "-c", '"$@" &', "sh", sys.executable, "-S", "-c", source, name[1:]],
                           env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            pass

    def connect(name, line, source, wait):
        """A connection to the guard `name` that took `line` (it answers ok), the guard started if there
        is none; None if none took it within `wait`."""
        import socket
        import time

        until, start_at = time.monotonic() + wait, 0.0
        while time.monotonic() < until:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(max(0.01, until - time.monotonic()))
                sock.connect(name)
                sock.sendall(line.encode())
                if sock.recv(3) == b"ok\n":  # taken: a guard that was exiting as this came closes instead
                    return sock
            except OSError:
                pass
            sock.close()
            if time.monotonic() >= start_at:  # none, or one exiting as this came: a new one
                start_guard(name, source)
                start_at = time.monotonic() + 0.5
            time.sleep(0.01)
        return None

    def end_request(node_id, pid, not_after, actor_id, due, grace, signum, source):
        """Hand the ending of an actor on this node to its job's guard: `signum` (0: none) now if it is
        still the Ray worker that existed at `not_after`, SIGKILL at `due` (wall clock), then its
        processes. The connection its answer comes on (`end_answer`), None if no guard took it."""
        line = f"end {pid} {not_after} {actor_id} {due} {grace} {signum or 0}\n"
        return connect(guard_name(node_id, actor_id), line, source, REGISTER_WAIT_S)

    def end_answer(sock, wait):
        """(Was it killed at its due time, how many of its processes were running when it was gone), once
        the guard has ended them; None if not yet within `wait`; (False, 0) if the guard is gone."""
        import socket

        try:
            sock.settimeout(wait)
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(64)
                if not chunk:
                    return False, 0
                data += chunk
        except (socket.timeout, BlockingIOError):
            return None  # an answer is one short line: a timeout comes before any of it
        except OSError:
            return False, 0
        _, killed, ended = data.decode().split()
        return killed == "1", int(ended)

    def end_on_node(node_id, pid, not_after, actor_id, due, grace, signum, source):
        """`end_request` and its answer, waited for: a zero-CPU task's, on another node than its ender."""
        import time

        sock = end_request(node_id, pid, not_after, actor_id, due, grace, signum, source)
        if sock is None:
            return False, 0
        with sock:
            return end_answer(sock, max(1.0, due - time.time()) + grace + 5.0) or (False, 0)

    return same_worker, clock, descendants, guard_name, connect, end_request, end_answer, end_on_node


same_worker, clock, descendants, guard_name, connect, end_request, end_answer, end_on_node = _make()


def remote_end_on(node_id):
    """`end_on_node` as a zero-CPU task pinned to that node (an ender on another node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(end_on_node)
    return task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))


_source: "list[str]" = []


def source() -> str:
    """What a guard runs (`start_guard`): processes.py's code, then this module's; read once."""
    if not _source:
        from .. import processes

        parts = []
        for path in (processes.__file__, __file__):
            with open(path, encoding="utf-8") as f:
                parts.append(f.read())
        _source.append("\n".join(parts))
    return _source[0]


# ---- the actor's side: registration -------------------------------------------

class _Link:
    """This process's registration with its guard; a fork child starts with none."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid: "int | None" = None  # the process it is for
        self.sock = None               # its connection


_state = _Link()
REGISTER_WAIT_S = 2.0  # a guard's start (python -S, psutil) and its first answer


def watch(actor_id: str, grace: float, wait: float = REGISTER_WAIT_S) -> bool:
    """In an actor: registered with its job's guard on this node, started if there is none. Once a
    process; False if no guard took it within `wait` (the driver's exit still ends its processes)."""
    import ray

    link = _state
    with link.lock:
        if link.pid == os.getpid():
            return True
        name = guard_name(ray.get_runtime_context().get_node_id(), actor_id)
        sock = connect(name, f"watch {actor_id} {grace}\n", source(), wait)
        if sock is None:
            return False
        sock.setblocking(False)  # `due` runs in a signal handler: it never waits
        link.pid, link.sock = os.getpid(), sock
        return True


def due(at: float) -> None:
    """In a registered actor that is ending: it must be gone at `at` (wall clock), or the guard kills it."""
    sock = _state.sock if _state.pid == os.getpid() else None
    if sock is not None:
        try:
            sock.send(f"due {at}\n".encode())
        except OSError:  # the guard is gone: nothing to tell
            pass


def after_fork_in_child() -> None:
    """A fork child is no actor: the inherited connection is closed here (the parent's stays open)."""
    global _state
    sock, _state = _state.sock, _Link()
    if sock is not None:
        sock.close()


# ---- the guard ----------------------------------------------------------------

class _Process:
    """An actor or a process of its tree, as `terminate` takes it: running while it is still the process
    created at `created`, and signalled only then (never a reused pid); sent `signum` (0: none, its
    ender's SIGTERM is on its way) once, whoever asks again."""

    def __init__(self, pid, created, signalled, lock, signum=signal.SIGTERM):
        self.pid, self.created, self.signalled, self.lock, self.signum = pid, created, signalled, lock, signum
        self.killed = False

    def _send(self, signum):
        """`signum` (0: none) if it is still running as itself; whether it was."""
        import psutil

        try:
            process = psutil.Process(self.pid)
            if process.create_time() != self.created or process.status() == psutil.STATUS_ZOMBIE:
                return False
            if signum:
                os.kill(self.pid, signum)
            return True
        except (psutil.Error, ProcessLookupError):
            return False

    @property
    def exitcode(self):
        return None if self._send(0) else 0

    def terminate(self):
        with self.lock:
            fresh = self.signum and (self.pid, self.created) not in self.signalled
            if fresh:
                self.signalled.add((self.pid, self.created))
        if fresh:
            self._send(self.signum)

    def kill(self):
        self.killed = True  # before the signal: its pidfd may say it is gone at once
        self.killed = self._send(signal.SIGKILL)

    def join(self, timeout):
        until = time.monotonic() + timeout
        while self.exitcode is None and time.monotonic() < until:
            time.sleep(min(0.02, max(0.0, until - time.monotonic())))  # never past `until`: a kill is due then


def serve(name):
    """The guard's loop: each actor registered (`watch`) or handed over (`end`) watched through a pidfd
    (where the kernel has none, a poll of its pid and creation time); when one is gone, its tree is ended
    by processes.py's rule, with its grace; an actor that is ending is by the same rule, its due time its
    grace (`terminate`, each in a thread of its own). Each ender is answered
    once its actor's tree is ended. Exits once it has had no actor, tree or connection for LINGER_S."""
    import selectors
    import socket
    import struct

    import psutil

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind("\0" + name)
    except OSError:  # another guard has it
        return
    listener.listen(128)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    actors = {}     # pid -> {"created", "actor_id", "grace", "pidfd", "known", "enders", "endings" (_Process)}
    endings = []    # a tree's: {"thread" (its `terminate`), "enders", "killed", "ended"}
    signalled, lock = set(), threading.Lock()  # (pid, created) sent SIGTERM: a process gets one
    ended = {}      # actor id -> how many of its processes were running when it was gone
    idle_since = time.monotonic()

    def adopt(pid, created, actor_id, grace):
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfd here: polled
            pidfd = None
        actors[pid] = {"created": created, "actor_id": actor_id, "grace": grace, "pidfd": pidfd,
                       "known": (), "enders": [], "endings": []}
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ, pid)
        return actors[pid]

    def end_actor(pid, entry, due_at, signum):
        """`signum` now (0: none), SIGKILL at `due_at` (wall clock) if it is still there."""
        actor = _Process(pid, entry["created"], signalled, lock, signum)
        entry["endings"].append(actor)
        threading.Thread(target=terminate, args=([actor], max(0.0, due_at - time.time())), daemon=True).start()

    def end_tree(tree, grace, enders, killed, actor_id):
        ended[actor_id] = max(len(tree), ended.get(actor_id, 0))
        ending = threading.Thread(target=terminate, args=([_Process(*p, signalled, lock) for p in tree], grace),
                                  daemon=True)
        ending.start()
        endings.append({"thread": ending, "enders": enders, "killed": killed, "ended": ended[actor_id]})

    def take(conn, line):
        word, _, rest = line.partition(" ")
        if word == "watch":
            actor_id, grace = rest.split()
            pid = struct.unpack("3i", conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            try:
                created = psutil.Process(pid).create_time()
            except psutil.Error:  # gone already: its tree by its id
                created = 0.0
            if pid not in actors:
                adopt(pid, created, actor_id, float(grace))
            conn.sock.send(b"ok\n")
            return pid
        if word == "due" and conn.pid in actors:
            entry = actors[conn.pid]
            entry["known"] = descendants(conn.pid, entry["created"], None, entry["known"])
            end_actor(conn.pid, entry, float(rest), 0)
        elif word == "end":
            fields = rest.split()
            pid, not_after, actor_id = int(fields[0]), float(fields[1]), fields[2]
            due_at, grace, signum = float(fields[3]), float(fields[4]), int(fields[5])
            conn.sock.send(b"ok\n")
            entry = actors.get(pid)
            if entry is None and same_worker(pid, not_after):
                entry = adopt(pid, psutil.Process(pid).create_time(), actor_id, grace)
            if entry is None:  # gone already: its processes by its id, and those it had
                end_tree(descendants(pid, not_after, actor_id, (), clock()), grace, [conn], False, actor_id)
                return conn.pid
            entry["known"] = descendants(pid, entry["created"], None, entry["known"])
            entry["enders"].append(conn)
            end_actor(pid, entry, due_at, signum)
        return conn.pid

    def gone(pid):
        entry = actors.pop(pid)
        if entry["pidfd"] is not None:
            selector.unregister(entry["pidfd"])
            os.close(entry["pidfd"])
        tree = descendants(pid, entry["created"], entry["actor_id"], entry["known"], clock())
        killed = any(actor.killed for actor in entry["endings"])
        end_tree(tree, entry["grace"], entry["enders"], killed, entry["actor_id"])

    class Conn:
        def __init__(self, sock):
            self.sock, self.pid, self.buffer = sock, None, b""

    while True:
        wait = 0.1 if endings or any(e["pidfd"] is None for e in actors.values()) else 0.5
        for key, _ in selector.select(wait):
            if key.data is None:
                sock, _ = listener.accept()
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ, Conn(sock))
            elif isinstance(key.data, Conn):
                conn = key.data
                try:
                    data = conn.sock.recv(4096)
                except OSError:
                    data = b""
                if not data:  # the actor's end of it closed: its pidfd says when it is gone
                    selector.unregister(conn.sock)
                    conn.sock.close()
                    continue
                *lines, conn.buffer = (conn.buffer + data).split(b"\n")
                for line in lines:
                    try:
                        conn.pid = take(conn, line.decode())
                    except Exception:  # a line cut short, an actor gone as it spoke: the guard goes on
                        pass
            elif key.data in actors:
                gone(key.data)
        now = time.monotonic()
        for pid, entry in list(actors.items()):
            if entry["pidfd"] is None and _Process(pid, entry["created"], signalled, lock).exitcode is not None:
                gone(pid)
        for ending in list(endings):  # answered here: this thread alone uses the connections
            if not ending["thread"].is_alive():
                endings.remove(ending)
                for conn in ending["enders"]:
                    try:
                        conn.sock.send(f"done {int(ending['killed'])} {ending['ended']}\n".encode())
                    except OSError:  # its ender is gone
                        pass
        if actors or endings or len(selector.get_map()) > 1:
            idle_since = now
        elif now - idle_since >= LINGER_S:
            listener.close()
            return


if __name__ == "__main__":  # the guard
    import sys

    del sys.path[0]  # the current folder (-c): its modules are named as libraries are
    serve(sys.argv[1])
