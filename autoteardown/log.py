"""stdlib logging, imported only when something is actually logged.

`import logging` costs several milliseconds, and every Python process pays for
`import autoteardown` when it sits in a sitecustomize, so the logger is made on
first use. Debug calls return at once unless AUTOTEARDOWN_DEBUG=1.
"""

import sys

_debug = False
_logger = None


def set_debug(enabled):
    global _debug
    _debug = bool(enabled)
    if _logger is not None:
        _logger.setLevel("DEBUG" if _debug else "WARNING")


def get_logger():
    global _logger
    if _logger is None:
        import logging

        logger = logging.getLogger("autoteardown")
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("autoteardown: %(levelname)s: %(message)s"))
            logger.addHandler(handler)
            logger.propagate = False
        logger.setLevel("DEBUG" if _debug else "WARNING")
        _logger = logger
    return _logger


def debug(msg, *args):
    if _debug:
        get_logger().debug(msg, *args)


def warning(msg, *args):
    try:
        get_logger().warning(msg, *args)
    except Exception:
        pass


_warned = set()


def warning_once(msg, *args):
    if msg not in _warned:
        _warned.add(msg)
        warning(msg, *args)


def failure(label, exc):
    """One line for the user; the traceback only with AUTOTEARDOWN_DEBUG=1."""
    warning("%s: %s: %s", label, type(exc).__name__, exc)
    if _debug:
        get_logger().debug("%s failed", label, exc_info=exc)


def debug_exception(msg, *args):
    """A bug in the shim or a failing finalizer: logged, never raised or printed as a traceback."""
    if _debug:
        get_logger().debug(msg, *args, exc_info=True)
