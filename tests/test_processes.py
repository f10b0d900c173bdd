"""processes.terminate, the one rule that ends processes: SIGTERM once, the grace, SIGKILL."""

import multiprocessing
import signal
import time

from autoteardown import processes

FORK = multiprocessing.get_context("fork")
MARGIN = 10.0  # two busy processes on two cores


def _ignores_sigterm(ready):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(120)


def _finishes_on_sigterm(ready, finished):
    def handler(signum, frame):
        time.sleep(0.3)  # its own work, within the grace
        finished.set()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, handler)
    ready.set()
    time.sleep(120)


def _started(target, *events):
    ready = FORK.Event()
    process = FORK.Process(target=target, args=(ready, *events), daemon=True)
    process.start()
    assert ready.wait(60)
    return process


def test_a_process_that_ignores_sigterm_is_killed_at_the_grace():
    process = _started(_ignores_sigterm)
    start = time.monotonic()
    assert processes.terminate([process], 1.0) == []
    assert process.exitcode == -signal.SIGKILL
    assert 1.0 <= time.monotonic() - start < 1.0 + MARGIN


def test_a_handler_has_the_grace_to_finish_and_is_never_killed():
    finished = FORK.Event()
    process = _started(_finishes_on_sigterm, finished)
    assert processes.terminate([process], 30.0) == []
    assert process.exitcode == 0 and finished.is_set()


def test_give_up_ends_the_grace_early():
    process = _started(_ignores_sigterm)
    start = time.monotonic()
    assert processes.terminate([process], 60.0, give_up=lambda: True) == []
    assert process.exitcode == -signal.SIGKILL
    assert time.monotonic() - start < processes.ASK_EVERY_S + MARGIN


def test_a_process_already_gone_is_not_signalled():
    process = FORK.Process(target=time.sleep, args=(0,))
    process.start()
    process.join(60)
    start = time.monotonic()
    assert processes.terminate([process], 30.0) == []
    assert process.exitcode == 0 and time.monotonic() - start < MARGIN
