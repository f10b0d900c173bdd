"""The deadline: every time budget of an ending, derived here from the two settings.

T (AUTOTEARDOWN_TIMEOUT) is what an ending may take from the moment it begins: the first SIGTERM
taken, or the exit hook's call when no signal came; `finalize(timeout)` gives its own. The
deadline is made once, at that moment (`of_ending`), and handed down to the teardown's steps.

- The steps (engine.py): each may use the time left, but a second for each later step, and at
  least its fair share (`share`). A step still running then is left behind, and a second past the
  deadline the process ends as it was ending (`hard_end`); so does a teardown run inline that hangs.
- A SIGTERM (signals.py's rule 4): the main thread has WAIT_FOR_MAIN_THREAD to be unwound; with no
  teardown at half of T the engine takes over (`take_over_at`); at T + 1 s the process ends whatever
  still runs (`hard_end`).

- A tracker's end that moves none of its records for T is let go (`stalled_after`: a server that
  stalls), and the runs Ray Tune leaves open at an experiment's end are ended within T
  (`tune_runs_end`): neither holds the job longer than an ending may take.

G (AUTOTEARDOWN_RAY_GRACE_S) is what whoever ends a Ray actor waits before it kills it (`grace`). Inside the
actor: the teardown gets G - 1 s (at most T, at least 0.5 s: `actor_teardown`), a watchdog ends the
process at G - 0.25 s (`actor_watchdog`) and its guard kills it at G + 0.5 s (`actor_due`). Ray's own
abort after a SIGTERM moves to T + RAY_ABORT_S, in whole seconds (`ray_abort`). Its ender waits G for
the actor, then G for the processes it started (`actors_gone`), a task on another node 30 s more
(it needs a worker of its own there). Tune kills a logging actor once its run is written out,
within G (`grace`).

T and G are read from config here and nowhere else: every budget above has one definition.
"""

import math
import time

from . import config

WAIT_FOR_MAIN_THREAD = 1.0  # for a SIGTERM's unwind to begin in the main thread (signals.py, rule 4)
LATER_STEP_S = 1.0   # kept back for each later step of the teardown
HARD_END_S = 1.0     # past the deadline, the process ends whatever still runs
RAY_ABORT_S = 3      # abseil's alarm_on_failure_secs in Ray's failure-signal handler
REMOTE_TASK_S = 30.0  # a task ending an actor on another node: its worker's start, on a loaded node


def of_ending(began: "float | None" = None, timeout: "float | None" = None) -> float:
    """The deadline (monotonic) of an ending that began at `began` (now), allowed `timeout` (T)."""
    return (time.monotonic() if began is None else began) + (config.TIMEOUT if timeout is None else timeout)


def share(deadline: float, later_steps: int) -> float:
    """What one step may use: all that is left but LATER_STEP_S for each later step, at least its fair share."""
    remaining = deadline - time.monotonic()
    return max(remaining / (later_steps + 1), remaining - later_steps * LATER_STEP_S)


def hard_end(deadline: float) -> float:
    """When the process ends as it was ending, whatever still runs."""
    return deadline + HARD_END_S


def stalled_after() -> float:
    """A tracker's end that has moved none of its records for this long is let go: T."""
    return config.TIMEOUT


def tune_runs_end() -> float:
    """Ray Tune's runs left open at an experiment's end, all of them ended within T."""
    return config.TIMEOUT


def grace() -> float:
    """G: what whoever ends a Ray actor waits for it before it kills it."""
    return config.RAY_GRACE


def take_over_at(began: float) -> float:
    """After a SIGTERM taken at `began`: the engine tears down itself if none is under way."""
    return began + config.TIMEOUT / 2


def ray_abort() -> int:
    """Ray's abort after a SIGTERM, deferred past our teardown (signal.alarm counts whole seconds)."""
    return math.ceil(config.TIMEOUT) + RAY_ABORT_S


def actor_teardown(patience: "float | None" = None) -> float:
    """An actor's in-band teardown, when its ender kills it `patience` (G) after asking."""
    return min(config.TIMEOUT, max(0.5, (config.RAY_GRACE if patience is None else patience) - 1.0))


def actor_watchdog() -> float:
    """After an actor's teardown begins: its process ends, stack dumped, just inside its grace."""
    return max(0.5, config.RAY_GRACE - 0.25)


def actor_due(now: float) -> float:
    """Wall clock: an ending actor's guard kills it then if it is still there (a backup to its ender)."""
    return now + config.RAY_GRACE + 0.5


def actors_gone(due: float) -> float:
    """Monotonic: the actors due to be gone at `due`, and then the processes they started."""
    return due + config.RAY_GRACE + 1.0
