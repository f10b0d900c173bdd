"""Ending processes: the one rule for every process the shim ends.

Each process still running gets SIGTERM once and has `grace` seconds to leave: its own handler
finishes its work, as it would at its parent's exit without the shim. Those left get SIGKILL,
and the shim waits for them to be gone (while the grace lasts, and at least KILLED_S), so that
whoever joins them next (torch's shutdown, multiprocessing's atexit) finds them gone. A process is
never signalled once it is no longer the one it was: a multiprocessing child's pid stays its own
until it is joined, and the Ray guard's processes carry their creation time.

Standalone (the standard library only, no part of autoteardown): the Ray guard runs this
module's code ahead of its own, on nodes where autoteardown may not be installed.
"""

import time

KILLED_S = 0.5  # a SIGKILLed process dies at once, if slowly on a loaded machine
ASK_EVERY_S = 0.5  # how often `give_up` is asked while the processes have their grace


def terminate(processes, grace, give_up=None):
    """End `processes` (each with terminate(), kill(), join(timeout) and exitcode, as a
    multiprocessing.Process) by the rule; those still running after it. `give_up()`, asked every
    ASK_EVERY_S of the grace, says that no handler can finish (waiting is for nothing): SIGKILL
    comes then."""
    until = time.monotonic() + grace
    running = _running(processes)
    for process in running:
        _call(process.terminate)
    while running and time.monotonic() < until:
        _join(running, min(until, time.monotonic() + ASK_EVERY_S))
        running = _running(running)
        if running and give_up is not None and time.monotonic() < until and give_up():
            break
    for process in running:
        _call(process.kill)
    _join(running, max(until, time.monotonic() + KILLED_S))
    return _running(running)


def _running(processes):
    running = []
    for process in processes:
        try:
            if process.exitcode is None:
                running.append(process)
        except Exception:  # not this process's child any more: nothing to end
            pass
    return running


def _join(processes, until):
    for process in processes:
        _call(process.join, max(0.0, until - time.monotonic()))


def _call(method, *args):
    try:
        method(*args)
    except Exception:  # gone as it was asked: nothing to end
        pass
