"""stdlib logging, made on first use (`import logging` costs milliseconds). Debug calls
return at once unless AUTOTEARDOWN_DEBUG=1, which also puts the pid (and rank) on
every line, for ranks and workers sharing one stderr.
"""

import os
import sys

_debug = False
_logger = None
_warned = set()
# Warnings printed in this process tree: children inherit it and do not repeat them.
TREE_MARKER = "AUTOTEARDOWN_INTERNAL_WARNED"


def set_debug(enabled):
    global _debug
    _debug = bool(enabled)
    if _logger is not None:
        _logger.setLevel("DEBUG" if _debug else "WARNING")


def is_debug():
    return _debug


def get_logger():
    global _logger
    if _logger is None:
        import logging

        class Formatter(logging.Formatter):
            def format(self, record):
                rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
                where = (f"[pid {os.getpid()}" + (f" rank {rank}" if rank else "") + "] ") if _debug else ""
                return f"autoteardown: {where}{record.levelname}: {super().format(record)}"

        logger = logging.getLogger("autoteardown")
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(Formatter())
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


def warning_once(msg, *args, tree=False):
    """Warn once per formatted message; tree=True: once per process tree."""
    try:
        text = msg % args if args else msg
    except Exception:
        text = f"{msg} {args!r}"
    if text in _warned:
        return
    _warned.add(text)
    if tree:
        import zlib

        key = f"{zlib.crc32(text.encode()):08x}"
        seen = os.environ.get(TREE_MARKER, "")
        if key in seen.split(","):
            return
        try:
            os.environ[TREE_MARKER] = f"{seen},{key}" if seen else key
        except Exception:
            pass
    warning("%s", text)


def debug_exception(msg, *args, exc_info=True):
    """A bug in the shim or a failing finalizer: its traceback only with AUTOTEARDOWN_DEBUG=1."""
    if _debug:
        get_logger().debug(msg, *args, exc_info=exc_info)
