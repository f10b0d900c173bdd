"""The exit engine: one place that finalizes every recorded resource, in order,
within a deadline, however the process ends, and never changes how it ends.

Why it runs before torch's, wandb's and Ray's own exit hooks: atexit runs
last-in-first-out, and those libraries register their hooks after we are
imported (torch when torch.utils.data is imported, wandb when its service
starts, Ray at import and in ray.init). So atexit cannot put us first. We use
`threading._register_atexit` instead: CPython calls those functions from
`threading._shutdown()`, which `Py_FinalizeEx` runs before *any* atexit
callback (it is how concurrent.futures stops its workers). They run after an
uncaught exception's traceback is printed and before non-daemon threads are
joined. Where it is missing we fall back to atexit.

Every ending comes through that hook, SIGTERM included: signals.py makes the
main thread unwind with SystemExit(143) instead of doing any work in signal
context, and after the teardown the process dies of the signal. The deadline
then counts from the signal, and the signal helper thread enforces it.

Each step runs in a runner thread, so a hung one cannot hang the exit: it may
use the time left but a second for each later step, and is then abandoned.
Another runner drives the steps while the calling thread only waits: a signal
handler can raise into the main thread at any point (torch's SIGCHLD handler
does), and only a wait can ignore that.
Runners are started when the engine is armed, before shutdown: Python
3.12.0-3.12.2 refuse new threads once finalization has begun (gh-104690). If
none can be had, the step runs inline and the signal helper thread ends the
process with its own exit code should it hang. No path changes the status.
Errors are one warning line, never raised.
"""

import os
import sys
import time
import _thread

from . import config, log, registry

_kinds = []              # (order, kind, finalize_one, after_all, in_child, on_sigterm), sorted by order
_lock = _thread.RLock()
_busy = _thread.allocate_lock()  # held by the finalize() under way
_finalizer = None        # ident of the thread running it
_code_override = None    # exit_code= of the finalize() under way
_armed_pid = None        # pid in which arm() set up the exit hook
_hooked = False          # the exit hook is registered (inherited by fork children)
_signals_ready = False   # signals.install() ran in the main thread of this process
_exiting = _exit_done = False
_signal = None           # (signum, monotonic time) of the SIGTERM our handler took
_raise_after = False     # a SIGTERM came during the main thread's own finalize() call
_exit_status = None      # (status, frame): the SystemExit leaving __main__ (see _track_exit)
_mp_exitcode = None      # a multiprocessing child's exit code (see _on_exit)
_idle = []               # queues of idle runner threads
_runners = set()         # their idents
_monitoring_tool = None
describers = {}          # kind -> describe(obj), for the report


def register_kind(kind, order, finalize_one, after_all=None, in_child=None, on_sigterm=None, describe=None):
    """Declare how to finalize resources of `kind`.

    finalize_one(obj, timeout): finalize one live object, within `timeout` seconds.
    after_all(timeout): run once after the kind's objects (e.g. wandb.teardown).
    in_child(obj): called in a fork child for each object the parent had, so the
    child never touches it.
    on_sigterm(obj): called in the main thread for each object when our SIGTERM
    handler is about to end the process, to stop watching what dies with it.
    describe(obj): a short name the user recognises, for the report.
    """
    if describe is not None:
        describers[kind] = describe
    with _lock:
        _kinds[:] = [k for k in _kinds if k[1] != kind]
        _kinds.append((order, kind, finalize_one, after_all, in_child, on_sigterm))
        _kinds.sort(key=lambda k: k[0])


def arm():
    """Set up the exit hook, a runner, exit-code tracking and SIGTERM (once per process).

    Called by the integrations when they patch, so a process that never imports
    torch, wandb or ray pays nothing for them. Called first off the main thread,
    the SIGTERM part is retried at the next resource recorded.
    """
    global _armed_pid, _hooked, _signals_ready
    if _armed_pid == os.getpid() and _signals_ready:
        return
    with _lock:
        if _armed_pid != os.getpid():
            _armed_pid = os.getpid()
            if not _hooked:
                _hooked = True
                try:
                    import threading

                    threading._register_atexit(_on_exit)
                except Exception:  # not CPython >= 3.9, or already shutting down
                    import atexit

                    atexit.register(_on_exit)
            _track_exit()
            _start_runner()  # two: one drives the steps, one runs them
            _start_runner()
            _report("header")
        if not _signals_ready:
            from . import signals

            _signals_ready = signals.install(sys.modules[__name__])
        registry.on_record = None if _signals_ready else arm


def finalize(timeout=None, kinds=None, exit_code=None):
    """Finalize every live resource now (or only those of `kinds`), in order,
    within `timeout` seconds (default AUTOTEARDOWN_TIMEOUT). Safe to call more
    than once: what was finalized is forgotten.

    exit_code: the code the finalizers hand on (wandb's exit record, mlflow's
    status) when the caller knows better than the process (a Ray Train worker
    whose training function raised).

    A KeyboardInterrupt or SystemExit raised in the calling thread while it waits
    stops the teardown (what is left stays recorded for the exit) and is raised
    again; so is a SIGTERM that arrived meanwhile in the main thread."""
    global _raise_after
    timeout = config.TIMEOUT if timeout is None else timeout
    interrupted = _finalize(time.monotonic() + timeout, kinds, exit_code)
    if interrupted is not None:
        raise interrupted
    if _raise_after and _thread.get_ident() == _main_ident() and _signal is not None:
        _raise_after = False
        raise SystemExit(128 + _signal[0])


def _finalize(deadline, only=None, exit_code=None, trigger=None):
    """One teardown, never raising; what interrupted the waiting thread, if anything.

    The steps are driven from a runner and this thread only waits: a Python signal
    handler may raise into the main thread at any bytecode (torch's SIGCHLD handler
    does when the DataLoader workers die with the rank: torchrun SIGTERMs each rank's
    process group), and a wait is the one place that can shrug it off."""
    global _finalizer, _code_override
    if _finalizer == _thread.get_ident() or _thread.get_ident() in _runners:
        return None  # a step called finalize() (ray.shutdown() in a finalizer)
    if not _busy.acquire(timeout=max(0.0, deadline - time.monotonic())):
        log.warning("another teardown is still running; not finalized")
        return None
    _finalizer, _code_override = _thread.get_ident(), exit_code
    stop, done = [], _thread.allocate_lock()
    done.acquire()

    def steps():
        global _finalizer, _code_override
        try:
            stop.append(_run_steps(deadline, only, trigger, stop))
        except BaseException:
            log.debug_exception("finalize failed")
        finally:
            _finalizer = _code_override = None
            _busy.release()
            done.release()

    if not _submit(steps):
        steps()  # no thread to be had: inline
        return stop[-1] if stop else None
    interrupted = _wait(done, deadline + 1.0, "the teardown")
    if interrupted is not None:
        stop.append(interrupted)  # the steps stop before the next one; the rest stay recorded
        log.warning("teardown interrupted (%s)", type(interrupted).__name__)
    return interrupted


def _run_steps(deadline, only, trigger, stop):
    started = time.monotonic()
    steps = []
    with _lock:
        kinds = list(_kinds)
    for _, kind, finalize_one, after_all, _, _ in kinds:
        if only is not None and kind not in only:
            continue
        objs = registry.live(kind)
        steps += [(kind, obj, finalize_one) for obj in objs]
        if after_all is not None and objs:
            steps.append((kind, None, after_all))
    if not steps:
        return None
    code, exc, why = ending()
    _report("begin", trigger or why, code)
    for index, (kind, obj, func) in enumerate(steps):
        remaining = deadline - time.monotonic()
        if stop:
            return None
        if remaining <= 0:
            log.warning("deadline reached; not finalized: %s", ", ".join(_name(k, o) for k, o, _ in steps[index:]))
            break
        # A step may take all the time left but a second for each step after
        # it (never less than its fair share), so one hung step cannot starve the rest.
        left = len(steps) - index
        budget = max(remaining / left, remaining - (left - 1) * 1.0)
        if obj is not None:
            registry.forget(obj)  # just before its step: an interrupted teardown leaves the rest recorded
        interrupted = _run_bounded(kind, obj, func, budget)
        if interrupted is not None:  # inline, in the main thread
            log.warning("teardown interrupted (%s)", type(interrupted).__name__)
            return interrupted
    _report("end", time.monotonic() - started)
    return None


def _wait(done, until, what):
    """Wait for the lock `done` until `until`: what interrupted the wait (a KeyboardInterrupt
    or SystemExit), else None. Any other exception is a signal handler's raising into
    this (main) thread; not the user's to see now: keep waiting."""
    while True:
        try:
            # In slices: a signal that came to another thread (a runner's os.kill, a
            # Ctrl-C the kernel gave to any thread) runs its Python handler here only
            # between two bytecodes of this thread, never during a long lock wait.
            if done.acquire(timeout=min(0.05, max(0.0, until - time.monotonic()))) or time.monotonic() >= until:
                return None
        except (KeyboardInterrupt, SystemExit) as interrupted:
            return interrupted
        except Exception as exc:
            log.debug("while waiting for %s: %s: %s", what, type(exc).__name__, exc)


def _run_bounded(kind, obj, func, budget):
    """Run the step in a runner thread and wait at most `budget` seconds for it."""
    outcome = []
    done = _thread.allocate_lock()
    done.acquire()
    args = (budget,) if obj is None else (obj, budget)

    def step():
        try:
            func(*args)
            outcome.append(None)
        except BaseException as exc:  # SystemExit too: wandb.teardown can raise it
            outcome.append(exc)
        finally:
            done.release()

    started = time.monotonic()
    if _submit(step):
        interrupted = _wait(done, started + budget, _name(kind, obj))
        if interrupted is not None:
            return interrupted  # the step is left to itself, and so is reporting it
    else:
        # No runner and no new thread (Python 3.12.0-3.12.2 at shutdown): inline, and
        # should it hang, the process ends with the status it was going to have.
        from . import signals

        guard = signals.alarm(started + budget + 1.0, _exit_now)
        try:
            step()
        finally:
            signals.cancel(guard)
    elapsed = time.monotonic() - started
    name = _name(kind, obj)
    if not outcome:
        log.warning("%s: still running after %.1fs; left behind", name, elapsed)
        _report("step", kind, obj, "left behind", elapsed)
    elif outcome[0] is not None and not isinstance(outcome[0], SystemExit):
        log.failure(name, outcome[0])
        _report("step", kind, obj, f"failed: {type(outcome[0]).__name__}: {outcome[0]}", elapsed)
    else:
        _report("step", kind, obj, "finalized", elapsed)  # the report is the debug output
    return None


def _submit(step):
    """Hand the step to an idle runner, keeping one spare; False if no thread can be had."""
    with _lock:
        jobs = _idle.pop() if _idle else None
    if jobs is None:
        jobs = _start_runner(idle=False)
        if jobs is None:
            return False
    jobs.put(step)
    if not _idle:
        _start_runner()
    return True


def _start_runner(idle=True):
    import queue
    import threading

    jobs = queue.SimpleQueue()

    def serve():
        _runners.add(_thread.get_ident())
        while True:
            jobs.get()()
            with _lock:
                _idle.append(jobs)

    try:
        threading.Thread(target=serve, name="autoteardown-step", daemon=True).start()
    except RuntimeError:  # can't create new thread at interpreter shutdown
        return None
    if idle:
        with _lock:
            _idle.append(jobs)
    return jobs


def _exit_now():
    code = ending()[0]
    log.warning("a teardown step hung and no thread could be started to wait for it; exiting with %d", code)
    sys.modules["autoteardown.signals"].flush_output()
    os._exit(code)


def _name(kind, obj):
    report = _reporter()
    if report is not None:
        return f"{kind} {report.describe(kind, obj)}"  # never raises
    return f"{kind} {'(after all its resources)' if obj is None else type(obj).__name__}"


def _reporter():
    """autoteardown.report, only when a report is asked for (it is not imported otherwise)."""
    if config.DEBUG or config.REPORT:
        from . import report

        return report
    return None


def _report(event, *args):
    report = _reporter()
    if report is not None:
        try:
            getattr(report, event)(*args)
        except Exception:
            log.debug_exception("report %s failed", event)


def _on_exit():
    global _exiting, _exit_done, _mp_exitcode
    if _armed_pid != os.getpid():  # inherited through fork: the parent's business
        return
    _exiting = True
    _mp_exitcode = _multiprocessing_exitcode(sys._getframe(1))
    signal_ = _signal
    deadline = (signal_[1] if signal_ else time.monotonic()) + config.TIMEOUT
    interrupted = _finalize(deadline)
    if interrupted is not None:
        log.debug("exit teardown cut short by %r", interrupted)
    _exit_done = True
    if _signal is not None:  # a SIGTERM before or during the teardown: die of it, as without us
        sys.modules["autoteardown.signals"].die(_signal[0])


def _multiprocessing_exitcode(frame):
    """A multiprocessing child (spawn, forkserver) ends in BaseProcess._bootstrap, which
    catches what run() raised, sets `exitcode`, calls threading._shutdown() (so us), and
    only then returns it to sys.exit(). Nothing else shows that code yet: read it there."""
    bootstrap = getattr(sys.modules.get("multiprocessing.process"), "BaseProcess", None)
    code = getattr(getattr(bootstrap, "_bootstrap", None), "__code__", None)
    while frame is not None and code is not None:
        if frame.f_code is code:
            exitcode = frame.f_locals.get("exitcode")
            return exitcode if isinstance(exitcode, int) else None
        frame = frame.f_back
    return None


# ---- signals (called by signals.py) -----------------------------------------

def on_signal(signum, in_handler, again=False):
    """A SIGTERM for us to handle. True: the main thread should unwind (SystemExit).
    again: the handler put the unwinding off (signals.py) and asks once more."""
    global _signal, _raise_after
    if in_handler:
        _unwatch()  # first: before any other Python code of ours runs
    with _lock:
        first = _signal is None
        if first:
            _signal = (signum, time.monotonic())
    if not (first or again):
        return False  # a second SIGTERM: the first one's teardown and deadline stand
    from . import signals

    if first:  # whoever ends the process, it ends within the deadline counted from the signal
        signals.alarm(_signal[1] + config.TIMEOUT / 2, _overdue)
    if _exit_done:
        signals.die(signum)
    if _exiting:
        return False  # the exit hook finishes its teardown, then dies of the signal
    if _finalizer == _main_ident():
        # The main thread's own finalize() call: it finishes, then raises SystemExit.
        _raise_after = True
        return False
    return in_handler


def _unwatch():
    """The signal may have come to the whole process group (torchrun, SLURM): the DataLoader
    workers die with us, and torch's SIGCHLD handler raises "killed by signal" wherever the
    main thread is: in this handler, the unwinding, or threading._shutdown (which then
    skips our exit hook). The process is ending; stop watching what dies with it.
    That handler can also run inside this one, before it is done: then once more
    (the callbacks do nothing twice)."""
    for _ in range(3):
        try:
            for _, kind, _, _, _, on_sigterm in list(_kinds):
                for obj in registry.live(kind) if on_sigterm else ():
                    on_sigterm(obj)
            return
        except Exception:
            log.debug_exception("SIGTERM: stopping the watch failed")


def on_stuck(signum):
    """The main thread has not run our handler (stuck in C code): finalize from here, die."""
    on_signal(signum, False)
    if not _exiting:
        _finalize(_signal[1] + config.TIMEOUT)
    sys.modules["autoteardown.signals"].die(signum)


def _overdue():
    """Half the deadline after a SIGTERM: the main thread swallowed the SystemExit, or
    is still unwinding or stuck. Finalize from the helper thread if nobody has, then die."""
    from . import signals

    signum, at = _signal
    if not _exiting and _finalizer is None:
        log.debug("SIGTERM: the main thread has not exited after %.1fs; finalizing from a helper thread",
                  time.monotonic() - at)
        _finalize(at + config.TIMEOUT)
        signals.die(signum)
    signals.alarm(at + config.TIMEOUT + 1.0, lambda: signals.die(signum))


def _main_ident():
    import threading

    return threading.main_thread().ident


# ---- how the process is ending ---------------------------------------------

def exit_code():
    """The status the process is about to exit with, as far as Python lets us see it,
    and the uncaught exception if there is one: (code, exception or None)."""
    return ending()[:2]


def exit_signal():
    """The signal number the process is ending from (SIGTERM), or None."""
    return _signal[0] if _signal else None


def ending():
    """(code, uncaught exception or None, trigger). The first that applies:

    1. finalize(exit_code=n): the caller knows (a Ray Train worker's function raised).
    2. A SIGTERM our handler took: 128 + signum (the process then dies of it).
    3. The uncaught exception that ended __main__ (KeyboardInterrupt too): 1.
       `sys.last_exc` is trusted only outside interactive sessions and when its
       traceback starts in __main__'s own frame (a REPL, IPython or code.interact()
       leave stale ones behind).
    4. A multiprocessing child's exit code, read from BaseProcess._bootstrap.
    5. The SystemExit that left __main__: its code (None 0, a message 1). A
       SystemExit that was caught (argparse in try/except SystemExit) does not count.
    6. 0: __main__ ran to its end.
    """
    if _code_override is not None:
        return _code_override, None, f"finalize(exit_code={_code_override})"
    if _signal is not None:
        return 128 + _signal[0], None, "SIGTERM"
    exc = _uncaught()
    if exc is not None:
        return 1, exc, type(exc).__name__ if isinstance(exc, KeyboardInterrupt) else "exception"
    if _mp_exitcode is not None:
        return _mp_exitcode, None, "multiprocessing exit"
    status = _left_main()
    if status is not _NOTHING:
        code = 0 if status is None else status if isinstance(status, int) else 1
        return code, None, f"sys.exit({status!r})"
    return 0, None, "normal end" if _exiting else "finalize()"


_NOTHING = object()


def _uncaught():
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None or hasattr(sys, "ps1") or sys.flags.interactive:
        return None
    main = getattr(sys.modules.get("__main__"), "__dict__", None)
    tb = getattr(exc, "__traceback__", None)
    while tb is not None and tb.tb_frame.f_globals.get("__name__") == "runpy":  # python -m
        tb = tb.tb_next
    if tb is None or tb.tb_frame.f_globals is not main or tb.tb_frame.f_code.co_name != "<module>":
        return None
    return exc


def _left_main():
    """The code of the SystemExit that left __main__, or _NOTHING."""
    if _exit_status is None:
        return _NOTHING
    status, frame = _exit_status
    if frame is not None:  # Python < 3.12: did __main__'s frame end by returning?
        import opcode

        op = opcode.opname[frame.f_code.co_code[frame.f_lasti]] if frame.f_lasti >= 0 else ""
        if op in ("RETURN_VALUE", "RETURN_CONST"):
            return _NOTHING  # the SystemExit was caught; __main__ went on to its end
    return status


def _main_module_frame(frame):
    main = getattr(sys.modules.get("__main__"), "__dict__", None)
    found = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main:
            found = frame
        frame = frame.f_back
    return found


def _track_exit():
    """See the SystemExit that leaves __main__. Python 3.12+: sys.monitoring's PY_UNWIND
    event fires as it unwinds __main__'s frame (a bare `raise SystemExit(n)` too), and
    costs only when an exception unwinds a frame. Before 3.12 (or with no free tool
    id): wrap sys.exit(), remember the call and __main__'s frame, and at exit believe
    it only if that frame did not end by returning (so the SystemExit was not caught).
    A bare `raise SystemExit(n)` there is unseen: its code reads as 0, as for wandb."""
    global _monitoring_tool
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None and _monitoring_tool is None:
        for tool in (4, 3):
            try:
                monitoring.use_tool_id(tool, "autoteardown")
            except ValueError:  # taken (a debugger, coverage, a profiler)
                continue
            monitoring.register_callback(tool, monitoring.events.PY_UNWIND, _on_unwind)
            monitoring.set_events(tool, monitoring.events.PY_UNWIND)
            _monitoring_tool = tool
            return
    if _monitoring_tool is None and getattr(sys.exit, "__wrapped__", None) is None:
        original = sys.exit

        def exit(status=None):
            global _exit_status
            # Only the main thread's call ends the process: a thread that ends itself
            # with sys.exit() (wandb.teardown() does, in a runner) does not.
            if _thread.get_ident() == _main_ident():
                _exit_status = (status, _main_module_frame(sys._getframe(1)))
            original(status)

        exit.__wrapped__ = original
        exit.__doc__ = original.__doc__
        sys.exit = exit


def _on_unwind(code, offset, exception):
    global _exit_status
    if (isinstance(exception, SystemExit) and code.co_name == "<module>"
            and sys._getframe(1).f_globals is getattr(sys.modules.get("__main__"), "__dict__", None)
            and _thread.get_ident() == _main_ident()):
        _exit_status = (exception.code, None)


def disarm():
    """Undo arm() as far as possible (the threading exit hook stays, and does nothing)."""
    global _armed_pid, _signals_ready, _monitoring_tool
    _armed_pid, _signals_ready = None, False
    registry.on_record = None
    wrapped = getattr(sys.exit, "__wrapped__", None)
    if wrapped is not None and sys.exit.__name__ == "exit" and sys.exit.__module__ == __name__:
        sys.exit = wrapped
    if _monitoring_tool is not None:
        monitoring = sys.monitoring
        monitoring.set_events(_monitoring_tool, 0)
        monitoring.register_callback(_monitoring_tool, monitoring.events.PY_UNWIND, None)
        monitoring.free_tool_id(_monitoring_tool)
        _monitoring_tool = None
    if "autoteardown.signals" in sys.modules:
        sys.modules["autoteardown.signals"].uninstall()


# ---- fork safety -------------------------------------------------------------

def _after_fork_in_child():
    """A forked child starts with no resources, never finalizes its parent's, and
    has the default SIGTERM until it arms itself."""
    global _lock, _busy, _finalizer, _signals_ready, _exiting, _exit_done, _signal, _raise_after, _exit_status
    # Only the forking thread lives on in the child: a lock another thread held at the
    # fork would never be released here (registry and importhook reset their own).
    _lock, _busy = _thread.RLock(), _thread.allocate_lock()
    _finalizer, _signals_ready, _exiting, _exit_done = None, False, False, False
    _signal, _raise_after, _exit_status = None, False, None
    _idle.clear()
    _runners.clear()
    registry.on_record = arm  # a child that makes resources of its own (a DataLoader, a run) arms itself
    if "autoteardown.signals" in sys.modules:
        sys.modules["autoteardown.signals"].reset_in_child()
    in_child = {kind: cb for _, kind, _, _, cb, _ in _kinds if cb is not None}
    for kind, obj in registry.take_all():
        callback = in_child.get(kind)
        if callback is not None:
            try:
                callback(obj)
            except Exception:
                log.debug_exception("fork child: %s cleanup failed", kind)


os.register_at_fork(after_in_child=_after_fork_in_child)
