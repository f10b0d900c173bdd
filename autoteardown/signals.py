"""SIGTERM: finalize, then die of the signal, even if the main thread is stuck in C code.

With the default handler SIGTERM ends the process at once, with no cleanup at
all. While it is still the default we install a Python handler that calls the
exit engine and then dies of SIGTERM (same status as before). A handler the
user or a library installed is left alone: it decides, whether it was there
before ours or replaced it later (ray.init does), and the helper thread below
then stays out of its way.

A Python handler only runs when the main thread next runs Python code. A main
thread blocked in C code (a gloo/NCCL collective, a C++ join) would keep the
process alive until that call returns (37 s measured with a gloo barrier). So
the C-level handler's wakeup byte (`signal.set_wakeup_fd`) also wakes a helper
thread: if the main thread has not started the handler within a second, the
helper thread finalizes and ends the process itself. Where another library
already owns the wakeup fd (asyncio does), only the main-thread path is used.

Imported by `engine.arm()`, never at `import autoteardown`: `signal` costs more
than all of autoteardown.
"""

import os
import signal
import threading
import time

from . import log

WAIT_FOR_MAIN_THREAD = 1.0
_terminate = None    # engine's callback: terminate(signum) finalizes, then dies
_pid = None          # the process that installed the handler
_handler_ran = False
_wakeup = None       # (read_fd, write_fd) of our wakeup pipe


def install(terminate):
    """Route SIGTERM to terminate(signum), if its handler is the default (main thread only)."""
    global _terminate, _pid, _handler_ran
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            log.debug("SIGTERM already has a handler; leaving it alone")
            return
        signal.signal(signal.SIGTERM, _handler)
    except ValueError:
        log.debug("SIGTERM handler not installed: not in the main thread")
        return
    _terminate, _pid, _handler_ran = terminate, os.getpid(), False
    _start_watcher()


def uninstall():
    if signal.getsignal(signal.SIGTERM) is _handler:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:
            pass
    _stop_watcher()


def die(signum):
    """End the process with `signum`, as its default action would have."""
    try:
        signal.signal(signum, signal.SIG_DFL)
    except ValueError:
        # Not the main thread (the watcher): the signal module refuses, libc does not.
        import ctypes

        ctypes.CDLL(None).signal(int(signum), 0)  # 0 is SIG_DFL
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    time.sleep(1)
    os._exit(128 + signum)


def _handler(signum, frame):
    global _handler_ran
    _handler_ran = True
    if _terminate is not None and _pid == os.getpid():
        _terminate(signum)
    die(signum)


def _start_watcher():
    global _wakeup
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:
        previous = None
    if previous != -1:  # not the main thread, or the fd is someone else's: keep it theirs
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return
    _wakeup = (read_fd, write_fd)
    threading.Thread(target=_watch, args=(read_fd,), name="autoteardown-sigterm", daemon=True).start()


def _watch(read_fd):
    while True:
        try:
            data = os.read(read_fd, 512)
        except OSError:
            return
        if not data or _pid != os.getpid():
            return
        if signal.SIGTERM not in data:  # every Python-handled signal writes its number here
            continue
        if signal.getsignal(signal.SIGTERM) is not _handler:
            # Replaced since (by the user, by ray.init, by a Ray worker): that handler
            # decides, and may take its time; the normal exit path still finalizes.
            continue
        waited = time.monotonic() + WAIT_FOR_MAIN_THREAD
        while not _handler_ran and time.monotonic() < waited:
            time.sleep(0.01)
        if not _handler_ran:
            log.debug("SIGTERM: the main thread is busy in C code; finalizing from a helper thread")
            _terminate(signal.SIGTERM)
            die(signal.SIGTERM)


def _stop_watcher():
    global _wakeup
    if _wakeup is None:
        return
    read_fd, write_fd = _wakeup
    _wakeup = None
    try:
        if signal.set_wakeup_fd(-1) != write_fd:
            log.debug("the wakeup fd had been replaced")
    except ValueError:
        pass
    for fd in (write_fd, read_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def reset_in_child():
    """A fork child must not write its signals into the parent's wakeup pipe."""
    global _pid
    _pid = None
    _stop_watcher()
