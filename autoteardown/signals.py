"""SIGTERM: the main thread unwinds, the one exit path finalizes, the process dies of it.

v0.1 finalized inside the signal handler and never returned. That was worse
than no shim in four measured ways: work done in signal context waited on locks
the interrupted code held (wandb's console capture in print()); a second SIGTERM
nested in the first waited forever on the first one's lock; a handler that
chained to ours (Lightning's `_HandlersCompose`, ddtrace's style of calling the
previous handler first) never got control back, so its graceful path and the
status it chose were lost; and a fork child kept our handler without the
helper thread, so `Pool.terminate()` could not end it. The anchors' helpers
return or raise instead (ddtrace's `handle_signal`, Python's KeyboardInterrupt,
Ray's worker handler), and so do we:

- Ours is installed only while SIGTERM's handler is the default, in the main
  thread. A handler installed before or after ours is left alone: it decides.
- As the process's own handler, ours records the signal and raises
  SystemExit(128 + signum) in the main thread. The unwinding releases the locks
  the interrupted code held and runs its `finally` blocks; the exit hook
  (engine.py) then finalizes with code 143 and makes the process die of SIGTERM,
  the status it has without the shim.
- Called by another handler (ours is its "previous"), ours returns at once and
  does nothing else: the caller decides how the process ends, and the exit path
  then finalizes with the code the process really exits with (Lightning: 0
  after its graceful SIGTERMException). Finalizing there would end the wandb run
  and the DataLoader workers before the caller's own code used them.
- A second (third...) SIGTERM does nothing: the first one's deadline stands.
- Caught in the middle of multiprocessing's file-descriptor handoff (how a
  DataLoader worker passes a batch), the unwinding waits until it is done.
- A helper thread (started when armed) bounds everything: it sees each
  SIGTERM through `signal.set_wakeup_fd`, and if the main thread has not run our
  handler within WAIT_FOR_MAIN_THREAD (it is stuck in C code: a gloo barrier kept
  a rank alive 37.7 s), it finalizes and ends the process itself. It also keeps
  the engine's alarms: code that swallows the SystemExit, or unwinds too long,
  is ended within the deadline. Where another library owns the wakeup fd
  (asyncio does), only the alarms are kept.
- After the exit teardown SIGTERM kills at once, as the default does; in a fork
  child SIGTERM is the default again until the child arms itself.

Imported by `engine.arm()`, never at `import autoteardown`: `signal` costs more
than all of autoteardown.
"""

import os
import select
import signal
import sys
import threading
import time

from . import log

WAIT_FOR_MAIN_THREAD = 1.0
RETRY_UNWIND = 0.02
# multiprocessing's file-descriptor handoff (torch's DataLoader passes tensors this way)
_HANDOFF = (os.path.join("multiprocessing", "resource_sharer.py"), os.path.join("multiprocessing", "reduction.py"))
_unwind_pending = False
_engine = None       # engine.on_signal(signum, in_handler) and engine.on_stuck(signum)
_pid = None          # the process whose helper thread runs
_installed = None    # our handler is SIGTERM's (in _pid); None: not decided yet (main thread only)
_pipe = None         # (read_fd, write_fd) waking the helper thread; the wakeup fd if it was free
_own_wakeup = False
_alarms = []         # [when (monotonic), action] kept by the helper thread
_alarm_lock = threading.Lock()


def install(engine):
    """Start the helper thread (any thread) and, from the main thread, route SIGTERM to
    us if its handler is the default. False off the main thread: arm() tries again later."""
    global _engine, _pid, _installed
    if _pid != os.getpid():
        _engine, _pid, _installed = engine, os.getpid(), None
        _start_helper()
    if threading.current_thread() is not threading.main_thread():
        return False
    if _installed is None:
        try:
            _installed = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
            if _installed:
                signal.signal(signal.SIGTERM, _handler)
                _take_wakeup_fd()
            else:
                log.debug("SIGTERM already has a handler; leaving it alone")
        except (ValueError, OSError):
            _installed = False
    return True


def uninstall():
    global _pid, _installed
    if _pid == os.getpid() and _installed and signal.getsignal(signal.SIGTERM) is _handler:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:
            pass
    _installed = None
    _stop_helper()
    _pid = None


def reset_in_child():
    """A fork child gets the default SIGTERM back (the parent's helper thread is not
    here to bound anything) and never writes into the parent's pipe."""
    global _pid, _installed, _alarm_lock, _unwind_pending
    _unwind_pending = False
    if signal.getsignal(signal.SIGTERM) is _handler:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:
            pass
    _pid, _installed = None, None
    _alarm_lock = threading.Lock()
    _alarms.clear()
    _stop_helper()


def flush_output():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def die(signum):
    """End the process with `signum`, as its default action would have."""
    flush_output()
    try:
        signal.signal(signum, signal.SIG_DFL)
    except ValueError:
        # Not the main thread (the helper): the signal module refuses, libc does not.
        import ctypes

        ctypes.CDLL(None).signal(int(signum), 0)  # 0 is SIG_DFL
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    time.sleep(1)
    os._exit(128 + signum)


def alarm(when, action):
    """Call action() in the helper thread at time.monotonic() `when`; returns a token for cancel()."""
    token = [when, action]
    with _alarm_lock:
        _alarms.append(token)
    _wake()
    return token


def cancel(token):
    with _alarm_lock:
        if token in _alarms:
            _alarms.remove(token)


def _handler(signum, frame):
    if _pid != os.getpid():
        die(signum)  # not ours to handle (reset_in_child makes this unreachable)
    if signal.getsignal(signum) is not _handler:
        log.debug("SIGTERM: called by the handler that replaced ours; it decides")
        return
    global _unwind_pending
    try:
        end = _engine.on_signal(signum, True, again=_unwind_pending)
    except Exception:  # another handler ran inside ours and raised (torch's SIGCHLD one): again,
        # as a repeat: the first call may have recorded the signal already
        end = _engine.on_signal(signum, True, again=True)
    if end:
        if _in_handoff(frame) and not _group_signalled():
            # Unwinding now would drop a file-descriptor handoff with a DataLoader worker
            # half-way, and the worker prints ConnectionResetError (5 of 25 SIGTERMs under
            # load). It takes milliseconds: ask again in a moment. Not when the worker is
            # dying of the same signal: the handoff fails, and its error would be printed.
            _unwind_pending = True
            alarm(time.monotonic() + RETRY_UNWIND, lambda: os.kill(os.getpid(), signum))
            return
        _unwind_pending = False
        raise SystemExit(128 + signum)


def _group_signalled():
    """Did the signal come to our whole process group (torchrun, SLURM)? Then a child of
    ours in the group is dying of it too: a zombie, or a fatal signal pending (Linux /proc)."""
    fatal = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGKILL - 1))
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            children = f.read().split()
    except OSError:
        return False  # no /proc
    for pid in children:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, _, pgrp = f.read().rpartition(")")[2].split()[:3]
            with open(f"/proc/{pid}/status") as f:
                pending = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
        except (OSError, ValueError):
            continue  # gone already
        if int(pgrp) == os.getpgrp() and (state in "ZX" or any(mask & fatal for mask in pending)):
            return True
    return False


def _in_handoff(frame):
    # Also inside a __del__: Python swallows a SystemExit raised there ("Exception ignored").
    while frame is not None:
        if frame.f_code.co_filename.endswith(_HANDOFF) or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _start_helper():
    global _pipe, _own_wakeup
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    _pipe, _own_wakeup = (read_fd, write_fd), False
    threading.Thread(target=_helper, args=(read_fd,), name="autoteardown-signals", daemon=True).start()


def _take_wakeup_fd():
    global _own_wakeup
    try:
        previous = signal.set_wakeup_fd(_pipe[1], warn_on_full_buffer=False)
        _own_wakeup = previous == -1
        if not _own_wakeup:  # the fd is someone else's: keep it theirs
            signal.set_wakeup_fd(previous)
    except ValueError:
        pass


def _stop_helper():
    global _pipe, _own_wakeup
    if _pipe is None:
        return
    read_fd, write_fd = _pipe
    _pipe = None
    if _own_wakeup:
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass
    _own_wakeup = False
    for fd in (write_fd, read_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def _wake():
    pipe = _pipe
    if pipe is not None:
        try:
            os.write(pipe[1], b"\0")
        except OSError:
            pass


def _helper(read_fd):
    stuck_since = None
    while True:
        now = time.monotonic()
        with _alarm_lock:
            due = [a for a in _alarms if a[0] <= now]
            for a in due:
                _alarms.remove(a)
            waits = [a[0] - now for a in _alarms]
        for _, action in due:
            try:
                action()
            except Exception:
                log.debug_exception("alarm failed")
        if stuck_since is not None:
            if _engine.exit_signal() is not None:  # our handler took it (or took an earlier one)
                stuck_since = None
            elif now - stuck_since >= WAIT_FOR_MAIN_THREAD:
                stuck_since = None
                log.debug("SIGTERM: the main thread is busy in C code; finalizing from a helper thread")
                _engine.on_stuck(signal.SIGTERM)
            else:
                waits.append(stuck_since + WAIT_FOR_MAIN_THREAD - now)
        try:
            ready, _, _ = select.select([read_fd], [], [], max(0.0, min(waits)) if waits else None)
            data = os.read(read_fd, 512) if ready else b"\0"
        except (OSError, ValueError):
            return
        if not data or _pid != os.getpid():
            return
        # Every Python-handled signal writes its number. Only the first SIGTERM matters
        # here: once the engine has one, its alarms bound the rest.
        if (signal.SIGTERM in data and _own_wakeup and stuck_since is None
                and signal.getsignal(signal.SIGTERM) is _handler and _engine.exit_signal() is None):
            stuck_since = time.monotonic()
