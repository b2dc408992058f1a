"""``nixl.logging`` on tent (tent.compat.nixl.logging)."""

from tent.compat.nixl.logging import get_logger, set_log_level_by_env, setup_logging  # noqa: F401

__all__ = ["get_logger", "set_log_level_by_env", "setup_logging"]
