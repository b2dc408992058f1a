"""tent: a transfer engine for LLM inference (Python bindings).

A thin ctypes layer over ``libtent.so`` (bundled in this package; see
``include/tent.h`` for the C contract)::

    import numpy as np, tent

    with tent.Engine() as engine:
        src = np.arange(1 << 20, dtype=np.uint8)
        with engine.register(src) as region, engine.open_segment(peer_name) as peer:
            engine.write(region, peer, remote_addr)              # one request, synchronous
            reqs = tent.make_requests("write", region, peer, remote_addr,
                                      local_offsets=np.arange(128) * 4096, lengths=4096)
            with engine.transfer(reqs) as batch:                  # 128 requests, one call
                batch.wait()

numpy is optional (``pip install 'tent[numpy]'``): ``make_requests``, the
dtypes and the numpy views need it and say so when it is missing.

Importing tent does not load the library; the first call that needs it
does (so importing tent and then forking workers is safe). In a child
forked after the library was loaded, every call raises ``tent.ForkError``:
start workers with ``multiprocessing`` "spawn" or "forkserver".

Log lines go to ``logging.getLogger("tent")`` (warnings and errors unless
configured; ``tent.set_log_level("debug")`` shows transport choices,
connections and teardown); ``TENT_LOG``/``TENT_LOG_FILE`` override that.

Errors are ``tent.TentError`` subclasses, one per status code of tent.h,
that also subclass the natural builtin (``tent.NotFound`` is a KeyError,
``tent.Timeout`` a TimeoutError, ``tent.InvalidArgument`` a ValueError).
"""

from __future__ import annotations

from typing import Any

from ._buffers import Buffer, resolve
from ._engine import (
    AllocatedRegion,
    Batch,
    Engine,
    Notification,
    Region,
    RegionInfo,
    Segment,
    topology,
    version,
    version_info,
)
from ._errors import (
    ERRORS,
    AlreadyRegistered,
    AuthError,
    BufferTooSmall,
    Busy,
    Canceled,
    Closed,
    ForkError,
    InternalError,
    InvalidArgument,
    InvalidHandle,
    LibraryError,
    NameInUse,
    NoMemory,
    NotFound,
    NotRegistered,
    OutOfRange,
    Overlap,
    PermissionDenied,
    ProtocolError,
    TentError,
    Timeout,
    TransportError,
    Unsupported,
    VersionMismatch,
)
from ._lib import Request, RequestStatus
from ._log import get_log_level, set_log_level
from ._requests import READ, WRITE, RequestResult, make_requests
from ._version import __version__

__all__ = [
    "__version__",
    "version",
    "version_info",
    "topology",
    "Engine",
    "Region",
    "AllocatedRegion",
    "RegionInfo",
    "Segment",
    "Batch",
    "Notification",
    "RequestResult",
    "Request",
    "RequestStatus",
    "READ",
    "WRITE",
    "make_requests",
    "request_dtype",
    "status_dtype",
    "resolve",
    "Buffer",
    "ERRORS",
    "TentError",
    "LibraryError",
    "InvalidArgument",
    "InvalidHandle",
    "Overlap",
    "AlreadyRegistered",
    "NotRegistered",
    "Busy",
    "OutOfRange",
    "PermissionDenied",
    "NotFound",
    "Unsupported",
    "TransportError",
    "Timeout",
    "Closed",
    "NoMemory",
    "InternalError",
    "ForkError",
    "AuthError",
    "ProtocolError",
    "BufferTooSmall",
    "Canceled",
    "NameInUse",
    "VersionMismatch",
    "get_include",
    "get_cmake_dir",
    "set_log_level",
    "get_log_level",
]


def __getattr__(name: str) -> Any:
    # numpy dtypes are built on first access, so numpy stays optional.
    if name == "request_dtype":
        from ._requests import request_dtype

        return request_dtype()
    if name == "status_dtype":
        from ._requests import status_dtype

        return status_dtype()
    raise AttributeError(f"module 'tent' has no attribute {name!r}")


def get_include() -> str:
    """The directory holding the tent.h and tent.hpp this package was built with."""
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def get_cmake_dir() -> str:
    """The directory of the CMake package bundled with this wheel
    (tentConfig.cmake: the imported target ``tent::tent`` over the bundled
    libtent.so and headers). Hand it to CMake::

        cmake -DCMAKE_PREFIX_PATH="$(python -c 'import tent; print(tent.get_cmake_dir())')" ...

    and ``find_package(tent 0.1 REQUIRED)`` finds it.
    """
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", "cmake", "tent")
