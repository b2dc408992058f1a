"""``nixl._bindings`` on tent (tent.compat.nixl._bindings)."""

from tent.compat.nixl._bindings import *  # noqa: F401,F403
from tent.compat.nixl._bindings import (  # noqa: F401
    _nixlError,
    nixlBackendError,
    nixlCancelledError,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotPostedError,
    nixlNotSupportedError,
    nixlRegDList,
    nixlRemoteDisconnectError,
    nixlRemoteDList,
    nixlRepostActiveError,
    nixlUnknownError,
    nixlXferDList,
    nixlXferTelemetry,
)
