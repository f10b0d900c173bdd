"""Ending an actor's processes on its node: the actor, when it outlives its grace, and what it started.

The rule: when an actor's process ends, no process it started is left running. Its descendants,
however deep and whatever their session or process group, get SIGTERM once the actor is gone (an
engine releases its devices in its own handler; the actor's own teardown still had them) and
SIGKILL AUTOTEARDOWN_RAY_GRACE_S later. A process is the actor's if it was under the actor by
parent chain when the actor was told to end, or if it carries the actor's id in its environment
(MARKER: set in the actor before its first method, inherited by whatever it starts, and kept by a
process its parent's death left with PID 1), and in both cases was created after the actor (and,
for the id, before it was gone: a restarted actor keeps its id). A reaper (hand_off's, REAPER as
its MARKER) is never an actor's: it may be under one for a moment, and it must outlive it.
Every signal first checks the process's creation time, so a reused pid is never signalled.

Ray SIGKILLs an exiting actor's direct children itself; its per-worker process groups
(RAY_process_group_cleanup_enabled) miss anything started in a new session. What is left is ours.

`_make()` builds the functions so that cloudpickle ships them by value: they also run in a
zero-CPU task on the actor's node, where autoteardown may not be installed.
"""

import os
import threading

MARKER = "AUTOTEARDOWN_INTERNAL_RAY_ACTOR"
REAPER = "reaper"  # MARKER's value in hand_off's processes: no actor id


def mark(actor_id: str) -> None:
    """In the actor: what it starts from now on carries its id (the environment is inherited)."""
    os.environ[MARKER] = actor_id


def _make():
    def kill_if_same_process(pid, not_after, signum=9):
        """Send `signum` (SIGKILL) to `pid` if still the Ray worker that existed at `not_after`; 0 only asks."""
        import os

        import psutil

        try:
            process = psutil.Process(pid)
            command = " ".join(process.cmdline())
            # A reused pid belongs to a process created after the request.
            if process.create_time() > not_after or process.status() == psutil.STATUS_ZOMBIE or (
                    "ray::" not in command and "default_worker.py" not in command):
                return False
            os.kill(pid, signum)
            return True
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
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
                        if child.environ().get(MARKER) != REAPER:
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

    def signal_running(tree, signum):
        """Send `signum` to each process of `tree` still running as itself (0: none); those still running."""
        import os

        import psutil

        running = []
        for pid, created in tree:
            try:
                process = psutil.Process(pid)
                if process.create_time() != created or process.status() == psutil.STATUS_ZOMBIE:
                    continue
                if signum:
                    os.kill(pid, signum)
                running.append((pid, created))
            except (psutil.Error, ProcessLookupError):
                pass
        return running

    def end_tree(tree, grace):
        """SIGTERM, then SIGKILL after `grace` what is still running; how many were running."""
        import time

        running = signal_running(tree, 15)
        until = time.monotonic() + grace
        left = running
        while left and time.monotonic() < until:
            time.sleep(0.05)
            left = signal_running(left, 0)
        signal_running(left, 9)
        return len(running)

    def kill_when_due(pid, not_after, due, signum=None, actor_id=None, grace=0.0, known=()):
        """On the actor's node: send `signum` now; at `due` (wall clock), kill `pid` if it is still there;
        then end its descendants (with `known`, an earlier look). (Was it killed, how many were ended.)"""
        import time

        tree = descendants(pid, not_after, None, known)
        if signum:
            kill_if_same_process(pid, not_after, signum)
        killed = False
        while time.time() < due:
            if not kill_if_same_process(pid, not_after, 0):
                break
            time.sleep(0.05)
        else:
            killed = kill_if_same_process(pid, not_after)
        return killed, end_tree(descendants(pid, not_after, actor_id, tree, clock()), grace)

    return kill_if_same_process, clock, descendants, signal_running, kill_when_due


kill_if_same_process, clock, descendants, signal_running, kill_when_due = _make()


_feed: dict = {}  # this process's reaper: "pid" (the process it is this one's for), "fd" (its pipe's write end)
_feed_lock = threading.Lock()


def hand_off(endings, grace):
    """`kill_when_due(pid, not_after, due, None, actor_id, grace, known)` for each of `endings`, in a process
    of its own that outlives this one: an actor can end before what it ended has (at its grace, or at
    once when Ray kills it with no Python hook). One reaper a process, started at its first hand-off and
    fed every later one through a pipe (one JSON line each, written at once: the caller returns as soon
    as it is written). It handles what it was given after this process (the pipe's write end) is gone,
    and exits when nothing is left. A reaper that is gone or not reading is replaced."""
    import json

    line = (json.dumps([endings, grace]) + "\n").encode()
    with _feed_lock:
        for _ in range(2):
            if not reaper_running():
                _start_reaper()
            try:
                if os.write(_feed["fd"], line) == len(line):
                    return
            except OSError:  # gone (EPIPE) or not reading (full): a new one
                pass
            forget_reaper()
    raise OSError("no reaper process takes the endings")


def reaper_running():
    """Has this process a reaper (started by an earlier hand-off)?"""
    return _feed.get("pid") == os.getpid()


def _start_reaper():
    """Started in the background by a shell that exits at once (Ray SIGKILLs an exiting actor's direct
    children), so it is detached when this returns (a few ms; its own start follows), in a session of
    its own, marked as a reaper (so no actor's descendant). Its pipe is passed by fd number (a
    non-interactive shell gives a background job /dev/null as stdin). It runs this file without `site`
    (-S), so that no sitecustomize, and no autoteardown, slows it."""
    import subprocess
    import sys

    read_fd, write_fd = os.pipe()
    try:
        env = {**os.environ, MARKER: REAPER}
        env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)  # psutil's, without site
        reaper = [sys.executable, "-S", os.path.abspath(__file__), str(read_fd)]
        subprocess.run(["/bin/sh", "-c", '"$@" &', "sh", *reaper], env=env, start_new_session=True,
                       pass_fds=(read_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=10, check=False)
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    os.set_blocking(write_fd, False)  # a reaper that stopped reading never blocks the caller
    _feed.update(pid=os.getpid(), fd=write_fd)


def after_fork_in_child():
    """A fork child's reaper is not its parent's: the inherited pipe is closed (the parent's stays open)."""
    global _feed_lock
    _feed_lock = threading.Lock()
    forget_reaper()


def forget_reaper():
    """This process's pipe to its reaper closed: the reaper ends once what it was given is done."""
    fd = _feed.get("fd")
    _feed.clear()
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def detached_kill_on(node_id):
    """`kill_when_due` in a detached zero-CPU actor pinned to that node, which then ends itself: what
    an actor hands on at its own end for another node. A task there would be the actor's, and Ray
    kills a task with its owner; a detached actor has none. Restarts: a raylet SIGTERMs a worker
    leased for an actor whose owner died before the worker took it, detached or not (the ending
    is then done by the restarted one; its own end is `ray.kill`, which never restarts)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    reaper = ray.remote(num_cpus=0, max_restarts=3)(_reaper_class())
    return reaper.options(lifetime="detached", scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))


def _reaper_class():
    """Built in a function, so that cloudpickle ships it by value (see `_make`)."""

    class Reaper:
        def __init__(self, *args):
            import threading

            threading.Thread(target=self.reap, args=args, daemon=True).start()  # the constructor returns

        def reap(self, *args):
            import ray

            try:
                kill_when_due(*args)
            finally:
                ray.kill(ray.get_runtime_context().current_actor)

    return Reaper


def remote_kill_on(node_id):
    """`kill_when_due` as a zero-CPU task pinned to that node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(kill_when_due)
    return task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))


if __name__ == "__main__":  # hand_off's reaper: each ending as it comes, until the pipe is closed
    import sys

    del sys.path[0]  # this file's folder: its modules are named as libraries are
    import json

    with open(int(sys.argv[1]), "rb") as feed:
        for line in feed:
            try:
                endings, grace = json.loads(line)
                for pid, not_after, due, actor_id, known in endings:
                    threading.Thread(target=kill_when_due,
                                     args=(pid, not_after, due, None, actor_id, grace, known)).start()
            except (ValueError, TypeError):  # a line cut short (a write that was not whole)
                pass
    # The threads are not daemons: the interpreter exits once the last ending is done.
