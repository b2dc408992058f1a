"""tent's log lines in Python's ``logging`` module.

libtent logs through one process-wide sink (tent.h, "Logging"). Creating
an :class:`~tent.Engine` installs a callback that forwards every line to
``logging.getLogger("tent")`` and sets the library's level from that
logger's effective level, so with no configuration only warnings and errors
appear (through logging's last-resort handler, on stderr), and::

    logging.basicConfig(level=logging.DEBUG)     # or
    tent.set_log_level("debug")

shows the transport chosen per peer, connection and lease setup and
teardown, retries and deadline expiries. The level is read from the logger
when an engine is created and whenever :func:`set_log_level` is called;
later ``setLevel`` calls on the logger take effect with the next engine.

When ``TENT_LOG`` or ``TENT_LOG_FILE`` is set in the environment, the
library's own output (stderr, or that file, at that level) is left alone:
the environment is the operator's override.
"""

from __future__ import annotations

import _thread
import atexit
import logging
import os
import threading
from typing import Optional, Union

from . import _check, _lib
from ._errors import Busy, InvalidArgument, check, fork_error

logger = logging.getLogger("tent")

_TO_PYTHON = {
    _lib.TENT_LOG_DEBUG: logging.DEBUG,
    _lib.TENT_LOG_INFO: logging.INFO,
    _lib.TENT_LOG_WARN: logging.WARNING,
    _lib.TENT_LOG_ERROR: logging.ERROR,
}

# A Python level above every record tent sends: nothing is forwarded.
_OFF = logging.CRITICAL + 10

_NAMES = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "off": _OFF,
}

_lock = threading.Lock()
# Set on a thread while it handles a line from the library: that thread
# holds the library's log lock, so changing the sink from it would wait on
# a thread that waits (under _lock) for that log lock.
_inside = threading.local()
# The ctypes callback the library holds: it must stay alive while the
# library may call it, i.e. for the life of the process.
_callback: Optional[object] = None


def tent_level(python_level: int) -> int:
    """The TENT_LOG_* level that lets through what a Python logger at
    python_level would show."""
    if python_level <= logging.DEBUG:
        return _lib.TENT_LOG_DEBUG
    if python_level <= logging.INFO:
        return _lib.TENT_LOG_INFO
    if python_level <= logging.WARNING:
        return _lib.TENT_LOG_WARN
    if python_level <= logging.ERROR:
        return _lib.TENT_LOG_ERROR
    return _lib.TENT_LOG_OFF


def _forward(level: int, msg: Optional[bytes], _user: Optional[int]) -> None:
    # Called by the library, on any thread, with its log lock held: it
    # must never raise into C (ctypes would only print the traceback).
    _inside.active = True
    try:
        text = msg.decode("utf-8", "replace") if msg else ""
        logger.log(_TO_PYTHON.get(level, logging.ERROR), "%s", text)
    except KeyboardInterrupt:
        # A Ctrl-C raised while a line is forwarded on the main thread (the
        # library logs on the caller's thread) must not die here: it is
        # asked for again, and raised once control is back in Python.
        if threading.current_thread() is threading.main_thread():
            _thread.interrupt_main()
    except BaseException:  # noqa: BLE001 - nothing may escape into C
        pass
    finally:
        _inside.active = False


def environment_overrides() -> bool:
    """Whether TENT_LOG or TENT_LOG_FILE decide the library's output."""
    return bool(os.environ.get("TENT_LOG") or os.environ.get("TENT_LOG_FILE"))


def _restore_default() -> None:
    # At exit, before the interpreter goes away: lines logged after this
    # (engines finalized late) go to stderr, never into a dead interpreter.
    if _lib.loaded() and not _lib.forked:
        _lib.lib().tent_log_set_callback(_lib.tent_log_fn(), None)  # a NULL fn


def _refuse_inside_a_record() -> None:
    if getattr(_inside, "active", False):
        raise Busy("tent: called while handling one of tent's own log records (a logging handler or filter "
                   "must not change tent's logging or create engines)")


def forward() -> None:
    """Installs the forwarding callback (once) and syncs the level."""
    global _callback
    _refuse_inside_a_record()
    if _lib.forked:
        raise fork_error()  # before _lock, which a parent thread may have held at the fork
    dll = _lib.lib()
    with _lock:
        if _callback is None:
            cb = _lib.tent_log_fn(_forward)
            check(dll.tent_log_set_callback(cb, None))
            _callback = cb
            atexit.register(_restore_default)
        check(dll.tent_log_set_level(tent_level(logger.getEffectiveLevel())))


def on_engine_create() -> None:
    """Called before every engine is created."""
    if not environment_overrides():
        forward()


def set_log_level(level: Union[int, str]) -> None:
    """Sets the level of tent's log: a ``logging`` level (``logging.DEBUG``)
    or a name (``"debug"``, ``"info"``, ``"warn"``/``"warning"``,
    ``"error"``, ``"off"``). It sets the ``"tent"`` logger's level and the
    library's, and forwards the library's lines to that logger (unless
    TENT_LOG or TENT_LOG_FILE is set). Raises Busy when called from a
    handler or filter that is handling one of tent's records, and
    InvalidArgument for an unknown level."""
    _refuse_inside_a_record()  # before anything changes
    if isinstance(level, str):
        py = _NAMES.get(level.strip().lower())
        if py is None:
            raise InvalidArgument(f"unknown log level {level!r}: want one of {', '.join(_NAMES)}")
    elif isinstance(level, int) and not isinstance(level, bool):
        py = level
    elif not _check.is_bool(level) and _check.numpy_type("integer") is not None \
            and isinstance(level, _check.numpy_type("integer")):
        py = int(level)
    else:
        raise InvalidArgument(f"log level must be a logging level or a name, not {level!r}")
    logger.setLevel(py)
    if environment_overrides():
        check(_lib.lib().tent_log_set_level(tent_level(py)))
    else:
        forward()


def get_log_level() -> int:
    """The library's current level, a TENT_LOG_* value."""
    return int(_lib.lib().tent_log_get_level())
