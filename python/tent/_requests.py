"""Requests in bulk: ``tent.request_dtype`` (numpy), ``make_requests``
(vectorized), and results (``RequestResult``, ``tent.status_dtype``).

A batch is handed to the library as ONE contiguous array of ``tent_request``
structs: a numpy structured array of ``request_dtype``, or a ctypes array of
``tent.Request``. numpy is optional: it is imported only when one of these
helpers is used.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Dict, NamedTuple, Optional, Union

from . import _check, _lib
from ._errors import InvalidArgument, error_for

if TYPE_CHECKING:  # pragma: no cover
    import numpy

READ = _lib.TENT_OP_READ
WRITE = _lib.TENT_OP_WRITE

_dtypes: Dict[str, Any] = {}


def _numpy_dtype(struct: Any) -> Any:
    np = _check.numpy("tent.request_dtype and tent.status_dtype")

    kinds = {
        ctypes.c_uint16: np.uint16,
        ctypes.c_uint32: np.uint32,
        ctypes.c_int32: np.int32,
        ctypes.c_uint64: np.uint64,
        ctypes.c_void_p: np.uintp,
    }
    fields = [(name, np.dtype(kinds[ctype])) for name, ctype in struct._fields_]
    dt = np.dtype(
        {
            "names": [f[0] for f in fields],
            "formats": [f[1] for f in fields],
            "offsets": [getattr(struct, f[0]).offset for f in fields],
            "itemsize": ctypes.sizeof(struct),
        }
    )
    assert dt.itemsize == ctypes.sizeof(struct)
    return dt


def request_dtype() -> "numpy.dtype":
    """The numpy dtype with exactly tent_request's layout."""
    dt = _dtypes.get("request")
    if dt is None:
        dt = _dtypes["request"] = _numpy_dtype(_lib.Request)
    return dt


def status_dtype() -> "numpy.dtype":
    """The numpy dtype with exactly tent_request_status's layout."""
    dt = _dtypes.get("status")
    if dt is None:
        dt = _dtypes["status"] = _numpy_dtype(_lib.RequestStatus)
    return dt


_OPS = {"read": READ, "write": WRITE, READ: READ, WRITE: WRITE}


def opcode(op: Union[str, int]) -> int:
    """"read"/"write" or tent.READ/tent.WRITE -> the opcode."""
    if _check.is_bool(op):  # True == 1 == WRITE, but not by intent
        raise TypeError("op must be 'read', 'write', tent.READ or tent.WRITE, not a bool")
    try:
        return _OPS[op.lower() if isinstance(op, str) else op]
    except (KeyError, TypeError):
        raise InvalidArgument(f"op must be 'read', 'write', tent.READ or tent.WRITE, not {op!r}") from None


def _address(obj: Any, what: str) -> int:
    addr = getattr(obj, "addr", obj)
    try:
        return _check.u64(addr, what)
    except TypeError:
        raise TypeError(f"{what} must be a Region or an int address, not {type(obj).__name__}") from None


def segment_handle(segment: Any) -> int:
    """A Segment's handle (or a raw handle int), checked to fit a pointer."""
    seg = getattr(segment, "handle", segment)
    try:
        return _check.u64(seg, "segment handle")
    except TypeError:
        raise TypeError(f"segment must be a Segment, not {type(segment).__name__}") from None


def make_requests(
    op: Union[str, int],
    local: Any,
    segment: Any,
    remote: Any,
    *,
    local_offsets: Any,
    remote_offsets: Any = None,
    lengths: Any,
) -> "numpy.ndarray":
    """Builds n requests at once (vectorized, no Python loop per request).

    ``local`` is a Region (or a base address), ``remote`` the peer's base
    address (an int, e.g. the ``addr`` of the peer's region), ``segment`` a
    Segment (or its handle). Request i moves ``lengths[i]`` bytes between
    ``local + local_offsets[i]`` and ``remote + remote_offsets[i]``
    (``remote_offsets`` defaults to ``local_offsets``; ``lengths`` may be one
    int). Offsets and lengths must be integers (a float is a TypeError),
    offsets non-negative, lengths positive; no range may run past 2**64 and,
    for a Region, every local range must lie inside it (InvalidArgument).
    Returns a ``request_dtype`` array for ``Engine.transfer``.
    """
    np = _check.numpy("tent.make_requests")

    code = opcode(op)
    base = _address(local, "local")
    rbase = _address(remote, "remote")
    seg = segment_handle(segment)
    loff = _check.u64_array(np, local_offsets, "local_offsets").reshape(-1)
    roff = loff if remote_offsets is None else _check.u64_array(np, remote_offsets, "remote_offsets").reshape(-1)
    lens = _check.u64_array(np, lengths, "lengths")
    n = loff.shape[0]
    if n == 0:
        raise InvalidArgument("no requests: local_offsets is empty")
    if roff.shape != loff.shape:
        raise InvalidArgument(f"remote_offsets has {roff.shape[0]} entries, local_offsets {n}")
    try:
        lens = np.broadcast_to(lens, loff.shape)
    except ValueError:
        raise InvalidArgument(f"lengths has {lens.size} entries, local_offsets {n}") from None
    if (lens == 0).any():
        raise InvalidArgument("lengths must be positive")
    if getattr(local, "closed", False):
        from ._errors import InvalidHandle

        raise InvalidHandle("the local region is closed")
    if code == READ and getattr(local, "readonly", False):
        raise InvalidArgument("the local region is read-only memory: it cannot be the destination of a read")
    size: Optional[int] = getattr(local, "size", None)
    for side, offs, limit in (("local", loff, _check.U64_END - base if size is None else size),
                              ("remote", roff, _check.U64_END - rbase)):
        ok = _check.ranges_fit(np, offs, lens, limit)
        if not ok.all():
            i = int(np.argmin(ok))
            where = f"the region ({size} bytes)" if side == "local" and size is not None else "2**64"
            raise InvalidArgument(
                f"request {i}: {side} range {int(offs[i])}+{int(lens[i])} from {base if side == 'local' else rbase:#x} "
                f"runs past {where}"
            )
    out = np.zeros(n, dtype=request_dtype())
    out["opcode"] = code
    out["local_addr"] = loff + np.uint64(base)  # no wrap: checked above
    out["segment"] = seg
    out["remote_addr"] = roff + np.uint64(rbase)
    out["length"] = lens
    return out


_transport_names: Dict[int, str] = {}


def transport_name(t: int) -> str:
    """tent_transport_name(t) (plain C, cached)."""
    name = _transport_names.get(t)
    if name is None:
        name = _transport_names[t] = _lib.lib().tent_transport_name(t).decode()
    return name


class RequestResult(NamedTuple):
    """The outcome of one request of a batch."""

    code: int  # TENT_OK, TENT_PENDING or a TENT_ERR_* code
    transport: str  # "local", "shm", "tcp", "cuda" (or "none" if none was tried)
    bytes: int  # bytes moved
    retried: bool  # the first transport failed and another one served it
    staged: bool = False  # GPU memory went through host memory (tcp)
    nic: Optional[int] = None  # the first local NIC that carried it (rdma), else None
    nics: int = 0  # how many local NICs carried parts of it

    @property
    def ok(self) -> bool:
        return self.code == _lib.TENT_OK

    @property
    def pending(self) -> bool:
        return self.code == _lib.TENT_PENDING

    @property
    def error(self) -> Optional[Exception]:
        """The exception for a failed request (None if it did not fail);
        its message is the status text (per-request messages are not kept
        by the library)."""
        if self.code >= 0:
            return None
        return error_for(self.code, _lib.lib().tent_status_str(self.code).decode())


def result_of(s: _lib.RequestStatus) -> RequestResult:
    has_nic = bool(s.flags & _lib.TENT_STATUS_NIC)
    return RequestResult(s.status, transport_name(s.transport), s.bytes, bool(s.flags & _lib.TENT_STATUS_RETRIED),
                         bool(s.flags & _lib.TENT_STATUS_STAGED), s.nic if has_nic else None,
                         s.nics if has_nic else 0)
