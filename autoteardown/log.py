"""stdlib logging, made on first use (`import logging` costs milliseconds). Debug calls
return at once unless AUTOTEARDOWN_DEBUG=1, which also puts the pid (and rank) on
every line, for ranks and workers sharing one stderr.

Records of the "autoteardown" logger propagate: a program that configured logging (a
handler on the root logger) gets them through its own handlers and format. One that
configured nothing gets them from ours, one line each on stderr ("autoteardown: ...").
"""

import os
import sys


class _State:
    """This module's state: inherited by a fork child as it is (the same settings, the same logger)."""

    def __init__(self) -> None:
        self.debug = False
        self.logger = None
        self.warned: "set[str]" = set()  # the warnings printed in this process


_state = _State()
# Warnings printed in this process tree: children inherit it and do not repeat them.
TREE_MARKER = "AUTOTEARDOWN_INTERNAL_WARNED"


def set_debug(enabled: bool) -> None:
    _state.debug = bool(enabled)
    if _state.logger is not None:
        _state.logger.setLevel("DEBUG" if _state.debug else "WARNING")


def is_debug() -> bool:
    return _state.debug


def get_logger():
    if _state.logger is None:
        import logging

        class Formatter(logging.Formatter):
            def format(self, record):
                rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
                where = (f"[pid {os.getpid()}" + (f" rank {rank}" if rank else "") + "] ") if _state.debug else ""
                return f"autoteardown: {where}{record.levelname}: {super().format(record)}"

        class Fallback(logging.StreamHandler):
            def emit(self, record):
                if not logging.getLogger().handlers:  # else the user's handlers get it (propagation)
                    super().emit(record)

        logger = logging.getLogger("autoteardown")
        if not logger.handlers:
            handler = Fallback(sys.stderr)
            handler.setFormatter(Formatter())
            logger.addHandler(handler)
        logger.setLevel("DEBUG" if _state.debug else "WARNING")
        _state.logger = logger
    return _state.logger


def debug(msg: str, *args: object) -> None:
    if _state.debug:
        get_logger().debug(msg, *args)


def warning(msg: str, *args: object) -> None:
    try:
        get_logger().warning(msg, *args)
    except Exception:
        pass


def warning_once(msg: str, *args: object, tree: bool = False) -> None:
    """Warn once per formatted message; tree=True: once per process tree."""
    try:
        text = msg % args if args else msg
    except Exception:
        text = f"{msg} {args!r}"
    if text in _state.warned:
        return
    _state.warned.add(text)
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


def debug_exception(msg: str, *args: object, exc_info: object = True) -> None:
    """A bug in the shim or a failing finalizer: its traceback only with AUTOTEARDOWN_DEBUG=1."""
    if _state.debug:
        get_logger().debug(msg, *args, exc_info=exc_info)
