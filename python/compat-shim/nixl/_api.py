"""``nixl._api`` on tent (tent.compat.nixl._api)."""

from tent.compat.nixl._api import *  # noqa: F401,F403
from tent.compat.nixl._api import (  # noqa: F401
    DEFAULT_COMM_PORT,
    nixl_agent,
    nixl_agent_config,
    nixl_backend_handle,
    nixl_prepped_dlist_handle,
    nixl_thread_sync_t,
    nixl_xfer_handle,
)
from tent.compat.nixl import _bindings as nixlBind  # noqa: F401
from tent.compat.nixl._api import __all__  # noqa: F401
