"""``nixl._utils`` on tent (tent.compat.nixl._utils)."""

from tent.compat.nixl._utils import ba_buf, free_passthru, malloc_passthru, verify_transfer  # noqa: F401

__all__ = ["ba_buf", "free_passthru", "malloc_passthru", "verify_transfer"]
