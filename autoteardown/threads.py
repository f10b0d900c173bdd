"""The package's threads, one lock: runner threads, which run the teardown's steps and
whatever may block, and one helper thread per process, which keeps every timer and runs
what a signal handler hands it.

- Runners start when a process is armed (Python 3.12.0-3.12.2 refuse new threads at exit),
  one spare kept idle; `submit` says False when no thread can be had, and the caller runs
  the work inline.
- The helper waits on a pipe (also the SIGTERM wakeup fd, signals.py) and on the earliest
  timer. Its actions must not block: `alarm` for a time, `soon` from a signal handler (no
  lock taken there). It is joined before its pipe is closed. A fork child starts with no
  runner, no helper and no timers.
"""

import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable

from . import forksafe, log

Action = Callable[[], object]


class _State:
    """This process's threads; a fork child starts with a new one (none of them runs there)."""

    def __init__(self, on_wakeup: "Callable[[bytes], None] | None" = None) -> None:
        self.lock = threading.Lock()
        self.idle: list = []          # the queues of idle runners
        self.alarms: list[list] = []  # [when (monotonic), action]; a signal handler never touches it
        self.soon: deque = deque()    # actions handed over by a signal handler
        self.helper: dict = {}        # "pid", "pipe" (read_fd, write_fd), "thread" of this process's helper
        self.on_wakeup = on_wakeup    # what the helper does with the bytes it read (signals.py's)


_state = _State()


# ---- runners ------------------------------------------------------------------------

def start_runner(idle: bool = True):
    """Start a runner; its queue (None if no thread can be had: interpreter shutdown)."""
    import queue

    jobs: queue.SimpleQueue = queue.SimpleQueue()

    def serve() -> None:
        while True:
            jobs.get()()
            with _state.lock:
                _state.idle.append(jobs)

    try:
        threading.Thread(target=serve, name="autoteardown-step", daemon=True).start()
    except RuntimeError:  # can't create new thread at interpreter shutdown
        return None
    if idle:
        with _state.lock:
            _state.idle.append(jobs)
    return jobs


def submit(work: Action) -> bool:
    """Hand `work` to an idle runner, keeping one spare; False if no thread can be had."""
    with _state.lock:
        jobs = _state.idle.pop() if _state.idle else None
    if jobs is None:
        jobs = start_runner(idle=False)
    if jobs is None:
        return False
    jobs.put(work)
    if not _state.idle:
        start_runner()
    return True


def run_soon(work: Action) -> None:
    """Run `work` in a runner, or inline if none can be had (an alarm's blocking part)."""
    if not submit(work):
        work()


# ---- the helper thread and its timers -------------------------------------------------

def alarm(when: float, action: Action) -> list:
    """Call action() (which must not block) in the helper thread at monotonic time `when`;
    a token for cancel()."""
    token = [when, action]
    with _state.lock:
        _state.alarms.append(token)
    start_helper()
    wake()
    return token


def cancel(token: list) -> None:
    with _state.lock:
        if token in _state.alarms:
            _state.alarms.remove(token)


def soon(action: Action) -> bool:
    """From a signal handler (no lock, no blocking): call action() in the helper thread at
    once. False where this process has no helper."""
    if _state.helper.get("pid") != os.getpid():
        return False
    _state.soon.append(action)
    wake()
    return True


def wakeup_fd() -> int:
    """The helper's pipe, for signal.set_wakeup_fd (it starts the helper)."""
    start_helper()
    return _state.helper["pipe"][1]


def wake() -> None:
    pipe = _state.helper.get("pipe")
    if pipe is not None:
        try:
            os.write(pipe[1], b"\0")
        except OSError:
            pass


def start_helper(on_wakeup: "Callable[[bytes], None] | None" = None) -> None:
    """Start this process's helper thread, once; `on_wakeup(data)`: what it does with what it reads
    from its pipe, the signal wakeup fd's (given by signals.install, kept until replaced)."""
    with _state.lock:
        if on_wakeup is not None:
            _state.on_wakeup = on_wakeup
        if _state.helper.get("pid") == os.getpid():
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        thread = threading.Thread(target=_serve, args=(read_fd,), name="autoteardown-helper", daemon=True)
        _state.helper.update(pid=os.getpid(), pipe=(read_fd, write_fd), thread=thread)
        thread.start()


def stop_helper(join: bool = True) -> None:
    """Stop the helper (joined first, unless in a fork child, where it does not run) and close its pipe."""
    pipe, thread = _state.helper.get("pipe"), _state.helper.get("thread")
    _state.helper.clear()
    if pipe is None:
        return
    if join and thread is not None and thread is not threading.current_thread():
        os.write(pipe[1], b"\0")  # it sees the pipe is no longer its own and returns
        thread.join(1.0)
    for fd in pipe:
        try:
            os.close(fd)
        except OSError:
            pass


def _serve(read_fd: int) -> None:
    while True:
        now = time.monotonic()
        with _state.lock:
            due = [a for a in _state.alarms if a[0] <= now]
            for a in due:
                _state.alarms.remove(a)
            waits = [a[0] - now for a in _state.alarms]
        due += [[None, _state.soon.popleft()] for _ in range(len(_state.soon))]
        for _, action in due:
            try:
                action()
            except Exception:
                log.debug_exception("alarm failed")
        try:
            ready, _, _ = select.select([read_fd], [], [], max(0.0, min(waits)) if waits else None)
            data = os.read(read_fd, 512) if ready else b""
        except (OSError, ValueError):
            return
        pipe = _state.helper.get("pipe")
        if pipe is None or pipe[0] != read_fd or _state.helper.get("pid") != os.getpid():
            return  # stopped, or a fork child's copy of the parent's fd
        if _state.on_wakeup is not None:
            _state.on_wakeup(data)


def _after_fork_in_child() -> None:
    global _state
    stop_helper(join=False)  # closes the parent's pipe
    _state = _State(_state.on_wakeup)  # a lock another thread may have held at the fork, the parent's runners and timers


forksafe.register(__name__, _after_fork_in_child)
