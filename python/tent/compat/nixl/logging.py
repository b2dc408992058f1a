"""``nixl.logging``: ``get_logger(name)`` returns a logger under "nixl"
(``_api`` -> ``nixl.api``, ``app.mod`` -> ``nixl.app.mod``), configured as
NIXL configures it: the "nixl" logger writes INFO and above to stdout
(``<time> NIXL <LEVEL> <file>:<line> <message>``) and does not propagate,
so a program's ``get_logger(__name__).info(...)`` lines show as with
NIXL; ``NIXL_LOG_LEVEL`` (TRACE, DEBUG, INFO, WARN, ERROR, FATAL) sets the
level. An application that already gave the "nixl" logger a handler
keeps its own."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

__all__ = ["get_logger", "set_log_level_by_env", "setup_logging"]

_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}


def set_log_level_by_env(nixl_logger: logging.Logger) -> None:
    level = os.environ.get("NIXL_LOG_LEVEL")
    if not level:
        return
    numeric = _LEVELS.get(level.upper())
    if numeric is None:
        nixl_logger.warning("Invalid NIXL_LOG_LEVEL value %r: using the configured level", level)
        return
    nixl_logger.setLevel(numeric)


class _Stdout(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on whatever sys.stdout is when a line is written (not the
    one at setup: test runners and applications replace it)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(logging.Formatter("%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d %(message)s",
                                            "%Y-%m-%d %H:%M:%S"))

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup_logging() -> None:
    """Configures the "nixl" logger once (idempotent: the handler is the
    mark), then applies NIXL_LOG_LEVEL."""
    nixl_logger = logging.getLogger("nixl")
    if not nixl_logger.handlers:
        nixl_logger.addHandler(_Stdout())
        nixl_logger.setLevel(logging.INFO)
        nixl_logger.propagate = False
    set_log_level_by_env(nixl_logger)


def get_logger(name: str) -> logging.Logger:
    """The logger ``nixl.<name without leading underscores>``, as NIXL
    names it (``get_logger("_api")`` -> ``nixl.api``, ``get_logger("app.x")``
    -> ``nixl.app.x``)."""
    setup_logging()
    return logging.getLogger(f"nixl.{name.lstrip('_')}")
