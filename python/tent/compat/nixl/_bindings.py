"""What clients import from ``nixl._bindings``: constants, enums, the
error classes, the descriptor lists and ``nixlXferTelemetry``.

The descriptor lists hold their descriptors in numpy arrays (one row per
descriptor: address, length, device id), so a transfer built from them
is one vectorized array for tent. They are serialized by
``nixl_agent.get_serialized_descs`` in tent's versioned encoding, never
with pickle.
"""

from __future__ import annotations

import enum
import os
from typing import Any, List, Optional, Tuple

NIXL_INIT_AGENT = ""
DEFAULT_COMM_PORT = 8888
HAVE_UCX_GPU_DEVICE_API = False


class nixl_mem_t(enum.IntEnum):  # noqa: N801 - NIXL's names
    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG = (nixl_mem_t.DRAM_SEG, nixl_mem_t.VRAM_SEG, nixl_mem_t.BLK_SEG,
                                                  nixl_mem_t.OBJ_SEG, nixl_mem_t.FILE_SEG)


class nixl_xfer_op_t(enum.IntEnum):  # noqa: N801
    NIXL_READ = 0
    NIXL_WRITE = 1


NIXL_READ, NIXL_WRITE = nixl_xfer_op_t.NIXL_READ, nixl_xfer_op_t.NIXL_WRITE


class nixl_status_t(enum.IntEnum):  # noqa: N801
    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9
    NIXL_ERR_REMOTE_DISCONNECT = -10
    NIXL_ERR_CANCELED = -11
    NIXL_ERR_NO_TELEMETRY = -12


globals().update({s.name: s for s in nixl_status_t})


class nixl_thread_sync_t(enum.IntEnum):  # noqa: N801
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0


NIXL_THREAD_SYNC_NONE = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
NIXL_THREAD_SYNC_STRICT = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
NIXL_THREAD_SYNC_RW = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
NIXL_THREAD_SYNC_DEFAULT = nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT


class nixl_cost_t(enum.IntEnum):  # noqa: N801
    NIXL_COST_ANALYTICAL_BACKEND = 0


NIXL_COST_ANALYTICAL_BACKEND = nixl_cost_t.NIXL_COST_ANALYTICAL_BACKEND


# ---- errors -----------------------------------------------------------------


class _nixlError(Exception):  # noqa: N801
    """Base of the compat layer's NIXL errors. ``status`` is the NIXL
    status, ``tent_error`` the tent exception behind it (or None)."""

    status = nixl_status_t.NIXL_ERR_UNKNOWN

    def __init__(self, message: str = "", tent_error: Optional[BaseException] = None) -> None:
        super().__init__(message or self.status.name)
        self.tent_error = tent_error


class nixlNotPostedError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_NOT_POSTED


class nixlInvalidParamError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_INVALID_PARAM


class nixlBackendError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_BACKEND


class nixlNotFoundError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_NOT_FOUND


class nixlMismatchError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_MISMATCH


class nixlNotAllowedError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_NOT_ALLOWED


class nixlRepostActiveError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_REPOST_ACTIVE


class nixlUnknownError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_UNKNOWN


class nixlNotSupportedError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_NOT_SUPPORTED


class nixlRemoteDisconnectError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_REMOTE_DISCONNECT


class nixlCancelledError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_CANCELED


class nixlNoTelemetryError(_nixlError):  # noqa: N801
    status = nixl_status_t.NIXL_ERR_NO_TELEMETRY


# ---- telemetry --------------------------------------------------------------


class nixlXferTelemetry:  # noqa: N801
    """One transfer's telemetry: ``startTime`` (microseconds since the
    epoch, when it was posted), ``postDuration`` and ``xferDuration``
    (microseconds: the post call, and post to completion as observed by
    ``check_xfer_state``), ``totalBytes``, ``descCount``."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes", "descCount")

    def __init__(self, startTime: int = 0, postDuration: int = 0, xferDuration: int = 0,  # noqa: N803
                 totalBytes: int = 0, descCount: int = 0) -> None:
        self.startTime = startTime
        self.postDuration = postDuration
        self.xferDuration = xferDuration
        self.totalBytes = totalBytes
        self.descCount = descCount

    def __repr__(self) -> str:
        return (f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
                f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, descCount={self.descCount})")


# ---- descriptor lists --------------------------------------------------------


def _np() -> Any:
    import numpy as np

    return np


def _fourth(value: Any, kind: str, i: int) -> Any:
    """The 4th field of a descriptor as NIXL's lists hand it back: a
    registration's meta info as bytes (given as str or bytes), a remote
    descriptor's agent name as str."""
    if kind == "reg":
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
    elif isinstance(value, str):
        return value
    elif isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    raise nixlInvalidParamError(f"{kind}: descriptor {i}: the 4th field must be str or bytes, "
                                f"not {type(value).__name__}")


def _rows(descs: Any, width: int, what: str) -> Tuple[Any, List[Any]]:
    """(an n x 3 uint64 array of (addr, len, dev), the 4th column: a
    registration's meta info as bytes, a remote descriptor's agent as str)."""
    np = _np()
    if isinstance(descs, np.ndarray):
        if descs.ndim != 2 or descs.shape[1] != 3:
            raise nixlInvalidParamError(f"{what}: descs must be a Nx3 numpy array")
        if descs.dtype.kind not in "iu":
            raise nixlInvalidParamError(f"{what}: descs must be a Nx3 numpy array of uint64 or int64")
        arr = np.ascontiguousarray(descs, dtype=np.uint64)
        return arr, [_empty(what)] * arr.shape[0]
    items = list(descs)
    arr = np.zeros((len(items), 3), dtype=np.uint64)
    extra: List[Any] = []
    for i, d in enumerate(items):
        if not isinstance(d, tuple):
            raise nixlInvalidParamError(f"{what}: each descriptor must be a tuple when provided as a list")
        if len(d) != width:
            raise nixlInvalidParamError(f"{what}: each descriptor tuple must have exactly {width} elements")
        try:
            a, n, dev = int(d[0]), int(d[1]), int(d[2])
        except (TypeError, ValueError):
            raise nixlInvalidParamError(f"{what}: descriptor {i}: address, length and device must be ints") from None
        if not (0 <= a < 1 << 64 and 0 <= n < 1 << 64 and 0 <= dev < 1 << 64):
            raise nixlInvalidParamError(f"{what}: descriptor {i} is out of range")
        arr[i] = (a, n, dev)
        extra.append(_fourth(d[3], what, i) if width == 4 else _empty(what))
    return arr, extra


def _empty(kind: str) -> Any:
    return b"" if kind == "reg" else ""


class _DList:
    """A typed descriptor list: rows of (addr, len, dev) in ``rows``."""

    _width = 3
    _kind = "xfer"

    def __init__(self, type: Any, descs: Any = None, init_size: int = 0) -> None:  # noqa: A002 - NIXL's name
        self._type = nixl_mem_t(int(type))
        np = _np()
        if descs is None or isinstance(descs, int):
            n = int(descs or init_size or 0)
            self.rows = np.zeros((n, 3), dtype=np.uint64)
            self._extra = [_empty(self._kind)] * n
        else:
            self.rows, self._extra = _rows(descs, self._width, self._kind)

    # NIXL's method names
    def getType(self) -> nixl_mem_t:  # noqa: N802
        return self._type

    def descCount(self) -> int:  # noqa: N802
        return int(self.rows.shape[0])

    def isEmpty(self) -> bool:  # noqa: N802
        return self.descCount() == 0

    def __len__(self) -> int:
        return self.descCount()

    def __bool__(self) -> bool:
        # NIXL's lists have no length protocol, so every list is true, an
        # empty one included: clients test ``if not descs`` for None (the
        # get_*_descs failure), not for emptiness.
        return True

    def _item(self, i: int) -> Tuple[Any, ...]:
        a, n, dev = (int(x) for x in self.rows[i])
        return (a, n, dev, self._extra[i]) if self._width == 4 else (a, n, dev)

    def __getitem__(self, i: int) -> Tuple[Any, ...]:
        if not -len(self) <= i < len(self):
            raise IndexError("descriptor index out of range")
        return self._item(i % len(self))

    def __setitem__(self, i: int, desc: Tuple[Any, ...]) -> None:
        row, extra = _rows([tuple(desc)], self._width, self._kind)
        self.rows[i] = row[0]
        self._extra[i] = extra[0]

    def __iter__(self) -> Any:
        return (self._item(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and self._type == other._type  # type: ignore[attr-defined]
                and list(self) == list(other))  # type: ignore[call-overload]

    def addDesc(self, desc: Tuple[Any, ...]) -> None:  # noqa: N802
        np = _np()
        row, extra = _rows([tuple(desc)], self._width, self._kind)
        self.rows = np.concatenate([self.rows, row])
        self._extra.extend(extra)

    append = addDesc

    def remDesc(self, index: int) -> None:  # noqa: N802
        np = _np()
        if not 0 <= index < len(self):
            raise nixlInvalidParamError("descriptor index out of range")
        self.rows = np.delete(self.rows, index, axis=0)
        del self._extra[index]

    def index(self, desc: Tuple[Any, ...]) -> int:
        row, extra = _rows([tuple(desc)], self._width, self._kind)
        want = tuple(int(x) for x in row[0]) + (tuple(extra) if self._width == 4 else ())
        for i, d in enumerate(self):
            if d == want:
                return i
        raise nixlNotFoundError(f"{desc!r} is not in the list")

    def clear(self) -> None:
        np = _np()
        self.rows = np.zeros((0, 3), dtype=np.uint64)
        self._extra = []

    def print(self) -> None:
        print(f"{type(self).__name__}({self._type.name}, {list(self)})")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._type.name} {len(self)} descriptors>"

    def trim(self) -> "_DList":
        """The same descriptors as a transfer list (nixlRegDList.trim)."""
        out = nixlXferDList(self._type)
        out.rows = self.rows.copy()
        out._extra = [""] * len(self)  # a transfer list has no 4th field
        return out


class nixlXferDList(_DList):  # noqa: N801
    """Descriptors to transfer: (address, length, device id)."""

    _width = 3
    _kind = "xfer"


class nixlRegDList(_DList):  # noqa: N801
    """Descriptors to register: (address, length, device id, meta info)."""

    _width = 4
    _kind = "reg"

    def __init__(self, type: Any, descs: Any = None, init_size: int = 0) -> None:  # noqa: A002
        np = _np()
        if isinstance(descs, np.ndarray):
            self._width = 3  # an Nx3 array: empty meta info per row
            super().__init__(type, descs, init_size)
            self._width = 4
            return
        super().__init__(type, descs, init_size)


class nixlRemoteDList(_DList):  # noqa: N801
    """Descriptors of remote memory: (address, length, device id, agent name)."""

    _width = 4
    _kind = "remote"


# ---- the bindings' agent -------------------------------------------------------

# The plugins an agent reports (getAvailPlugins): NIXL's network backends,
# each served by tent's transports, and tent's own transport names, which
# restrict an agent to them. Storage plugins (GDS, POSIX, OBJ, ...) move
# FILE/OBJ memory, which tent does not serve, so they are absent.
_PLUGINS = ("UCX", "UCX_MO", "LIBFABRIC", "UCCL", "MOONCAKE", "GPUNETIO", "TCP", "SHM", "LOCAL")

_TRUE = ("y", "yes", "on", "1", "true", "enable")
_FALSE = ("n", "no", "off", "0", "false", "disable")


class nixlAgentConfig:  # noqa: N801
    """The bindings' agent configuration, with NIXL's fields, defaults and
    positional order; ``nixl_agent`` fills one in from its
    ``nixl_agent_config``."""

    def __init__(self, useProgThread: bool = False, useListenThread: bool = False,  # noqa: N803
                 listenPort: int = DEFAULT_COMM_PORT, syncMode: Any = None, numWorkers: int = 1,
                 pthrDelay: int = 0, lthrDelay: int = 100000, captureTelemetry: bool = False) -> None:
        self.useProgThread = useProgThread
        self.useListenThread = useListenThread
        self.listenPort = listenPort
        self.syncMode = NIXL_THREAD_SYNC_DEFAULT if syncMode is None else syncMode
        self.captureTelemetry = captureTelemetry
        self.pthrDelay = pthrDelay
        self.lthrDelay = lthrDelay
        self.etcdWatchTimeout = 5000000  # microseconds, NIXL's default


class nixlAgent:  # noqa: N801
    """The bindings-level agent ``nixl_agent`` is built on (``nixl_agent.agent``):
    its name, its configuration, whether it captures telemetry, and the
    plugins it has. The transfer calls are ``nixl_agent``'s; this object
    serves none of the bindings' lower-level methods beyond
    ``getAvailPlugins``."""

    def __init__(self, name: str, config: nixlAgentConfig) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("Agent needs a non-empty name")  # NIXL: std::invalid_argument
        self.name = name
        self.config = config
        self.captureTelemetry = telemetry_enabled(bool(config.captureTelemetry))

    def getAvailPlugins(self) -> List[str]:  # noqa: N802
        return list(_PLUGINS)


def telemetry_enabled(requested: bool) -> bool:
    """Whether an agent captures telemetry: ``NIXL_TELEMETRY_ENABLE`` when it
    is set (yes/no words, as NIXL reads them; it overrides the agent's
    configuration either way), else the configuration's request."""
    raw = os.environ.get("NIXL_TELEMETRY_ENABLE")
    if raw is None or not raw.strip():  # set but empty: as unset (NIXL would refuse it)
        return requested
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise RuntimeError(f"Conversion to bool failed for string {raw!r} (NIXL_TELEMETRY_ENABLE): known are "
                       f"{', '.join(_TRUE)} as positive and {', '.join(_FALSE)} as negative")


__all__ = sorted(
    name for name, value in list(globals().items())
    if not name.startswith("_") and (name.isupper() or name.startswith("nixl"))
)
