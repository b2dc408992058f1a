"""tent-compat: NIXL's ``nixl`` package served by tent (a replacement for
the nixl wheel, not a companion). ``from nixl._api import nixl_agent``
gives ``tent.compat.nixl.nixl_agent``; see tent's docs/COMPAT.md.

Like the nixl wheel's top-level package, ``nixl`` itself carries every
public name of its submodules (``nixl.nixl_agent``, ``nixl.nixlXferDList``,
``nixl.nixlNotFoundError``, ``nixl.DRAM_SEG``, ``nixl.get_logger``,
``nixl.malloc_passthru``, ...) and the submodules as attributes
(``nixl._bindings``, ``nixl._utils``, ``nixl.logging``)."""

__tent_compat__ = True

from tent.compat import _shim as _tent_shim

_tent_shim.guard("nixl")

from . import _api, _bindings, _utils, logging  # noqa: E402,F401

_MODULES = (_api, _bindings, _utils, logging)  # later ones win a shared name, as in the nixl wheel
__all__ = sorted({name for module in _MODULES for name in module.__all__})
globals().update({name: getattr(module, name) for module in _MODULES for name in module.__all__})
