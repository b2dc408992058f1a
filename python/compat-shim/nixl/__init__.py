"""tent-compat: NIXL's ``nixl`` package served by tent (a replacement for
the nixl wheel, not a companion). ``from nixl._api import nixl_agent``
gives ``tent.compat.nixl.nixl_agent``; see tent's docs/COMPAT.md."""

__tent_compat__ = True

from tent.compat import _shim as _tent_shim

_tent_shim.guard("nixl")

from tent.compat.nixl import *  # noqa: E402,F401,F403
from tent.compat.nixl import __all__  # noqa: E402,F401
