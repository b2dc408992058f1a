"""``mooncake.engine`` on tent (tent.compat.mooncake)."""

from tent.compat.mooncake import (  # noqa: F401
    P2PHANDSHAKE,
    Read,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    Write,
)
