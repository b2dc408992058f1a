"""``mooncake.engine`` on tent (tent.compat.mooncake)."""

from tent.compat.mooncake import (  # noqa: F401
    P2PHANDSHAKE,
    SUPPORT_CUDA,
    SUPPORT_EFA,
    SUPPORT_HIP,
    SUPPORT_INTRA_NVLINK,
    SUPPORT_MNNVL,
    SUPPORT_MUSA,
    Read,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    Write,
)
