"""``nixl.logging``: ``get_logger(name)`` returns a logger under "nixl"
(``_api`` -> ``nixl.api``, ``app.mod`` -> ``nixl.app.mod``), its level from ``NIXL_LOG_LEVEL`` (TRACE,
DEBUG, INFO, WARN, ERROR, FATAL). Unlike NIXL's, it installs no handler:
lines go wherever the application's logging sends them."""

from __future__ import annotations

import logging
import os

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


def setup_logging() -> None:
    set_log_level_by_env(logging.getLogger("nixl"))


def get_logger(name: str) -> logging.Logger:
    """The logger ``nixl.<name without leading underscores>``, as NIXL
    names it (``get_logger("_api")`` -> ``nixl.api``, ``get_logger("app.x")``
    -> ``nixl.app.x``)."""
    setup_logging()
    return logging.getLogger(f"nixl.{name.lstrip('_')}")
