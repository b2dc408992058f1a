"""tent-compat: Mooncake's ``mooncake`` package served by tent (a
replacement for the mooncake-transfer-engine wheel, not a companion).
``from mooncake.engine import TransferEngine`` gives
``tent.compat.mooncake.TransferEngine``; see tent's docs/COMPAT.md."""

__tent_compat__ = True

from tent.compat import _shim as _tent_shim

_tent_shim.guard("mooncake")
