"""Loading libtent.so and the one table of its C declarations.

Everything that mirrors ``include/tent.h`` lives in this module: the
``#define`` constants, the ctypes Structures (exact layouts) and the
``argtypes``/``restype`` of every function. ``tests/python/test_header.py``
parses the header and fails if this module and the header disagree.

The library is loaded lazily, on the first call that needs it (``lib()``),
never at ``import tent``: a program that imports tent and then forks workers
is safe as long as the parent did not use tent before forking.

Which file is loaded: ``$TENT_LIBRARY`` if set, else the ``libtent.so``
bundled next to this file (the wheel ships it there).
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import POINTER, c_char, c_char_p, c_int32, c_int64, c_size_t, c_uint16, c_uint32, c_uint64, c_void_p
from typing import Any, Dict, List, Optional, Tuple

# ---- Constants (#define in tent.h) ----------------------------------------

TENT_VERSION_MAJOR = 0
TENT_VERSION_MINOR = 1
TENT_VERSION_PATCH = 0
TENT_ABI_VERSION = 1

TENT_OK = 0
TENT_PENDING = 1
TENT_ERR_INVALID_ARGUMENT = -1
TENT_ERR_INVALID_HANDLE = -2
TENT_ERR_OVERLAP = -3
TENT_ERR_ALREADY_REGISTERED = -4
TENT_ERR_NOT_REGISTERED = -5
TENT_ERR_BUSY = -6
TENT_ERR_OUT_OF_RANGE = -7
TENT_ERR_PERMISSION_DENIED = -8
TENT_ERR_NOT_FOUND = -9
TENT_ERR_UNSUPPORTED = -10
TENT_ERR_TRANSPORT = -11
TENT_ERR_TIMEOUT = -12
TENT_ERR_CLOSED = -13
TENT_ERR_NO_MEMORY = -14
TENT_ERR_INTERNAL = -15
TENT_ERR_FORKED = -16
TENT_ERR_AUTH = -17
TENT_ERR_PROTOCOL = -18
TENT_ERR_BUFFER_TOO_SMALL = -19
TENT_ERR_CANCELED = -20
TENT_ERR_NAME_IN_USE = -21
TENT_ERR_VERSION_MISMATCH = -22

TENT_REMOTE_READ = 0x1
TENT_REMOTE_WRITE = 0x2

TENT_TRANSPORT_NONE = 0
TENT_TRANSPORT_LOCAL = 1
TENT_TRANSPORT_SHM = 2
TENT_TRANSPORT_TCP = 3
TENT_TRANSPORT_CUDA = 4
TENT_TRANSPORT_RDMA = 5

TENT_OP_READ = 0
TENT_OP_WRITE = 1

TENT_STATUS_RETRIED = 0x1
TENT_STATUS_STAGED = 0x2
TENT_STATUS_NIC = 0x4

TENT_MAX_NAME_LEN = 1024
TENT_MAX_STRING_LEN = 4096

TENT_LOG_DEBUG = 0
TENT_LOG_INFO = 1
TENT_LOG_WARN = 2
TENT_LOG_ERROR = 3
TENT_LOG_OFF = 4

# Every #define of tent.h that is a plain integer, by name (the header test
# compares this with the header; macros with arguments and the *_INIT
# initializers are not values).
CONSTANTS: Dict[str, int] = {k: v for k, v in dict(globals()).items() if k.startswith("TENT_") and isinstance(v, int)}

# Limits documented in tent.h.
MAX_NOTIFY_LEN = 65536
# The most requests of one transfer, or regions of one batch call (tent.h).
MAX_BATCH = 1 << 24
# tent_engine_options.timeout_ms 0: the default request deadline (tent.h).
DEFAULT_TIMEOUT_MS = 30000

# ---- Structures (exact layouts of tent.h) ---------------------------------

tent_status = c_int32
# Opaque handles (tent_engine *, ...) are ids the library casts to pointers:
# in Python they are plain ints, passed and returned as c_void_p.
handle = c_void_p


class EngineOptions(ctypes.Structure):
    """tent_engine_options"""

    _fields_ = [
        ("size", c_uint32),
        ("reserved0", c_uint32),
        ("name", c_char_p),
        ("listen_addr", c_char_p),
        ("metadata", c_char_p),
        ("metadata_prefix", c_char_p),
        ("transports", c_char_p),
        ("secret", c_void_p),
        ("secret_len", c_size_t),
        ("timeout_ms", c_uint64),
        ("unregister_timeout_ms", c_uint64),
        ("tcp_streams", c_uint32),
        ("reserved1", c_uint32),
    ]


class RegionDesc(ctypes.Structure):
    """tent_region_desc"""

    _fields_ = [("addr", c_void_p), ("len", c_size_t), ("location", c_char_p)]


class RegionInfo(ctypes.Structure):
    """tent_region_info"""

    _fields_ = [
        ("size", c_uint32),
        ("flags", c_uint32),
        ("addr", c_uint64),
        ("len", c_uint64),
        ("location", c_char * 32),
    ]


class Stats(ctypes.Structure):
    """tent_stats"""

    _fields_ = [
        ("size", c_uint32),
        ("reserved0", c_uint32),
        ("regions", c_uint64),
        ("registered_bytes", c_uint64),
        ("reservations", c_uint64),
        ("handles", c_uint64),
        ("segments", c_uint64),
        ("batches", c_uint64),
        ("requests_in_flight", c_uint64),
        ("allocations", c_uint64),
        ("process_handles", c_uint64),
    ]


class Request(ctypes.Structure):
    """tent_request (``tent.request_dtype`` is the same layout for numpy).

    The constructor checks its values (ctypes alone would store 2**64 + x
    as x): integers only, each within its C type. Fields assigned one by
    one afterwards are stored the way C stores them."""

    _fields_ = [
        ("opcode", c_uint32),
        ("reserved", c_uint32),
        ("local_addr", c_void_p),
        ("segment", c_void_p),
        ("remote_addr", c_uint64),
        ("length", c_uint64),
    ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            from ._check import struct_values

            values, named = struct_values(self._fields_, args, kwargs, "tent.Request")
            super().__init__(*values, **named)
        else:
            super().__init__()


class TransferOptions(ctypes.Structure):
    """tent_transfer_options"""

    _fields_ = [
        ("size", c_uint32),
        ("reserved0", c_uint32),
        ("timeout_ms", c_uint64),
        ("notify", c_void_p),
        ("notify_len", c_size_t),
        ("transport", c_char_p),
    ]


class RequestStatus(ctypes.Structure):
    """tent_request_status"""

    _fields_ = [
        ("status", tent_status),
        ("transport", c_uint32),
        ("bytes", c_uint64),
        ("flags", c_uint32),
        ("nic", c_uint16),  # with TENT_STATUS_NIC (the space once `reserved`)
        ("nics", c_uint16),
    ]


# C struct name -> ctypes Structure.
STRUCTS: Dict[str, Any] = {
    "tent_engine_options": EngineOptions,
    "tent_region_desc": RegionDesc,
    "tent_region_info": RegionInfo,
    "tent_stats": Stats,
    "tent_request": Request,
    "tent_transfer_options": TransferOptions,
    "tent_request_status": RequestStatus,
}

# typedef void (*tent_log_fn)(int level, const char *msg, void *user);
tent_log_fn = ctypes.CFUNCTYPE(None, c_int32, c_char_p, c_void_p)

# ---- Functions: name -> (restype, argtypes) --------------------------------

_P = POINTER
FUNCTIONS: Dict[str, Tuple[Any, List[Any]]] = {
    "tent_version": (c_uint32, []),
    "tent_abi_version": (c_uint32, []),
    "tent_version_string": (c_char_p, []),
    "tent_status_str": (c_char_p, [tent_status]),
    "tent_last_error": (c_char_p, []),
    "tent_engine_create": (tent_status, [_P(EngineOptions), _P(handle)]),
    "tent_engine_destroy": (tent_status, [handle]),
    "tent_engine_name": (tent_status, [handle, c_char_p, c_size_t, _P(c_size_t)]),
    "tent_register": (tent_status, [handle, c_void_p, c_size_t, c_char_p, c_uint32, _P(handle)]),
    "tent_register_batch": (tent_status, [handle, _P(RegionDesc), c_size_t, c_uint32, _P(handle)]),
    "tent_unregister": (tent_status, [handle, handle]),
    "tent_unregister_batch": (tent_status, [handle, _P(handle), c_size_t]),
    "tent_region_get_info": (tent_status, [handle, handle, _P(RegionInfo)]),
    "tent_alloc": (tent_status, [handle, c_size_t, c_char_p, c_uint32, _P(c_void_p), _P(handle)]),
    "tent_free": (tent_status, [handle, handle]),
    "tent_transport_name": (c_char_p, [c_uint32]),
    "tent_engine_transports": (tent_status, [handle, c_char_p, c_size_t, _P(c_size_t)]),
    "tent_uninstall": (tent_status, [handle, c_char_p]),
    "tent_engine_stats": (tent_status, [handle, _P(Stats)]),
    "tent_engine_stats_json": (tent_status, [handle, c_char_p, c_size_t, _P(c_size_t)]),
    "tent_topology_json": (tent_status, [c_char_p, c_size_t, _P(c_size_t)]),
    "tent_segment_open": (tent_status, [handle, c_char_p, _P(handle)]),
    "tent_segment_close": (tent_status, [handle, handle]),
    "tent_transfer": (tent_status, [handle, _P(Request), c_size_t, _P(TransferOptions), _P(handle)]),
    "tent_transfer_poll": (tent_status, [handle, _P(Request), c_size_t, _P(TransferOptions), _P(handle)]),
    "tent_batch_status": (tent_status, [handle, _P(RequestStatus), c_size_t, _P(c_size_t)]),
    "tent_batch_wait": (tent_status, [handle, c_int64]),
    "tent_batch_destroy": (tent_status, [handle]),
    "tent_transfer_sync": (tent_status, [handle, _P(Request), c_size_t, _P(TransferOptions), _P(RequestStatus)]),
    "tent_transfer_columns": (
        tent_status,
        [handle, c_uint32, handle, _P(c_uint64), _P(c_uint64), _P(c_uint64), c_size_t, _P(TransferOptions), _P(handle)],
    ),
    "tent_transfer_columns_sync": (
        tent_status,
        [handle, c_uint32, handle, _P(c_uint64), _P(c_uint64), _P(c_uint64), c_size_t, _P(TransferOptions),
         _P(RequestStatus)],
    ),
    "tent_notify_send": (tent_status, [handle, handle, c_void_p, c_size_t]),
    "tent_notify_recv": (
        tent_status,
        [handle, c_int64, c_void_p, c_size_t, _P(c_size_t), c_char_p, c_size_t],
    ),
    "tent_log_set_level": (tent_status, [c_int32]),
    "tent_log_get_level": (c_int32, []),
    "tent_log_set_callback": (tent_status, [tent_log_fn, c_void_p]),
}

# The functions of the one-request path, declared a second time without
# argtypes: ctypes then converts nothing, which saves a from_param call per
# argument (about a third of a ctypes call into the library). Every
# argument passed to them must be a ctypes object of exactly the C
# parameter's type (c_void_p for a handle, c_size_t, c_int64, byref() or a
# ctypes array for a pointer) or None for NULL: a plain int would be passed
# as a C int.
UNTYPED = ("tent_transfer_sync", "tent_transfer_poll", "tent_batch_wait", "tent_batch_destroy",
           "tent_transfer_columns", "tent_transfer_columns_sync", "tent_batch_status")


class Untyped:
    """The UNTYPED functions of a loaded library, as attributes (the slots
    are UNTYPED, spelled out for the type checker)."""

    __slots__ = ("tent_transfer_sync", "tent_transfer_poll", "tent_batch_wait", "tent_batch_destroy",
                 "tent_transfer_columns", "tent_transfer_columns_sync", "tent_batch_status")
    tent_transfer_sync: Any
    tent_transfer_poll: Any
    tent_batch_wait: Any
    tent_batch_destroy: Any
    tent_transfer_columns: Any
    tent_transfer_columns_sync: Any
    tent_batch_status: Any

    def __init__(self, dll: ctypes.CDLL) -> None:
        assert self.__slots__ == UNTYPED
        for name in UNTYPED:
            fn = dll[name]  # a new function object: the declared one keeps its argtypes
            fn.restype = FUNCTIONS[name][0]
            setattr(self, name, fn)


# ---- Loading ---------------------------------------------------------------

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_untyped: Optional[Untyped] = None
_path: Optional[str] = None
# True in a child forked after the library was loaded: every call fails with
# TENT_ERR_FORKED there, and finalizers skip the library entirely.
forked = False


def _after_fork_in_child() -> None:
    global forked
    if _lib is not None:
        forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def library_path() -> str:
    """The file ``lib()`` loads: ``$TENT_LIBRARY``, else the bundled one."""
    env = os.environ.get("TENT_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libtent.so")


def loaded() -> bool:
    """Whether libtent.so is loaded in this process."""
    return _lib is not None


def version_compatible(abi: int, version: int) -> Optional[str]:
    """None if a library reporting (abi, version) works with this wrapper,
    else the reason it does not. Rule: the same ABI number and major
    version; within major 0 the same minor too (0.x minors may break), from
    1.0 on a library minor at least the wrapper's (minors only add)."""
    major, minor, patch = version >> 16, (version >> 8) & 0xFF, version & 0xFF
    want = f"{TENT_VERSION_MAJOR}.{TENT_VERSION_MINOR}.x (ABI {TENT_ABI_VERSION})"
    have = f"{major}.{minor}.{patch} (ABI {abi})"
    if abi != TENT_ABI_VERSION:
        return f"libtent {have} has ABI {abi}, this tent package needs ABI {TENT_ABI_VERSION} ({want})"
    if major != TENT_VERSION_MAJOR:
        return f"libtent {have} has major version {major}, this tent package needs {want}"
    if major == 0 and minor != TENT_VERSION_MINOR:
        return f"libtent {have} differs in minor version, which may break within 0.x; this tent package needs {want}"
    if minor < TENT_VERSION_MINOR:
        return f"libtent {have} is older than this tent package ({want})"
    return None


def _declare(dll: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in FUNCTIONS.items():
        fn = getattr(dll, name)
        fn.restype = restype
        fn.argtypes = argtypes


def lib() -> ctypes.CDLL:
    """The loaded library (loading and checking it on first use)."""
    dll = _lib
    if dll is not None:
        return dll
    return _load()


def _load() -> ctypes.CDLL:
    global _lib, _path, _untyped
    from ._errors import LibraryError, VersionMismatch

    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        try:
            dll = ctypes.CDLL(path)
        except OSError as exc:
            hint = (
                " ($TENT_LIBRARY names it)"
                if os.environ.get("TENT_LIBRARY")
                else " (the tent wheel bundles it; set $TENT_LIBRARY to use another build)"
            )
            raise LibraryError(f"cannot load libtent from {path}{hint}: {exc}") from exc
        for name in ("tent_abi_version", "tent_version"):
            if not hasattr(dll, name):
                raise LibraryError(f"{path} is not libtent: it has no {name}")
        dll.tent_abi_version.restype = c_uint32
        dll.tent_abi_version.argtypes = []
        dll.tent_version.restype = c_uint32
        dll.tent_version.argtypes = []
        reason = version_compatible(dll.tent_abi_version(), dll.tent_version())
        if reason is not None:
            raise VersionMismatch(f"{reason}; loaded from {path}")
        missing = [n for n in FUNCTIONS if not hasattr(dll, n)]
        if missing:
            raise LibraryError(f"{path} lacks functions this tent package needs: {', '.join(missing)}")
        _declare(dll)
        _untyped = Untyped(dll)
        _path = path
        _lib = dll
        return dll


def untyped() -> Untyped:
    """The loaded library's UNTYPED functions (loading it on first use)."""
    u = _untyped
    if u is None:
        lib()
        u = _untyped
        assert u is not None
    return u


def loaded_path() -> Optional[str]:
    """The path libtent.so was loaded from, or None before the first use."""
    return _path
