"""``nixl._bindings`` on tent (tent.compat.nixl._bindings)."""

from tent.compat.nixl._bindings import *  # noqa: F401,F403
from tent.compat.nixl._bindings import _nixlError  # noqa: F401 - not in __all__ (private in NIXL too)
from tent.compat.nixl._bindings import __all__  # noqa: F401,E402
