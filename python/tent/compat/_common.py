"""What the Mooncake and NIXL layers share: the settings read from the
environment, the transport a requested protocol/backend maps to, the
notification envelope, and request arrays built without a Python loop.

Environment (read when an engine/agent is created):

- ``TENT_COMPAT_TRANSPORTS``: tent transports in preference order
  ("shm,tcp", "tcp", ...), overriding what the protocol/backend names.
- ``TENT_COMPAT_SECRET``: the shared secret every peer must prove
  (tent's authenticated handshake); unset = none, as in Mooncake and NIXL.
- ``TENT_COMPAT_TIMEOUT``: the request deadline in seconds (Mooncake's
  ``MC_TRANSFER_TIMEOUT`` is honoured too); unset = tent's default (30 s).
"""

from __future__ import annotations

import array
import functools
import os
import struct
import threading
from typing import Any, List, Optional, Tuple

import tent
from tent import _lib

from . import _pybind

# Transport names tent itself knows; anything else a client asks for
# ("rdma", "UCX", "efa", ...) is served by tent's own choice per peer.
TENT_TRANSPORTS = ("local", "shm", "tcp", "cuda")


def transports_for(requested: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """(the tent transports string or None for "all, best first", a log
    line saying how a foreign name was served, or None)."""
    env = os.environ.get("TENT_COMPAT_TRANSPORTS")
    if env:
        return env, None
    name = (requested or "").strip().lower()
    if not name:
        return None, None
    if name in TENT_TRANSPORTS:
        return name, None
    return None, (
        f"{requested!r} requested: tent has no such transport; served by the best transport tent has "
        f"for each peer (local in-process, shm on the same host, tcp across hosts)"
    )


def secret() -> Optional[bytes]:
    s = os.environ.get("TENT_COMPAT_SECRET")
    return s.encode() if s else None


def timeout() -> Optional[float]:
    for var in ("TENT_COMPAT_TIMEOUT", "MC_TRANSFER_TIMEOUT"):
        v = os.environ.get(var)
        if v:
            try:
                t = float(v)
            except ValueError:
                raise ValueError(f"{var}={v!r} is not a number of seconds") from None
            if t > 0:
                return t
    return None


# ---- the notification envelope -----------------------------------------------
#
# Mooncake's notifies carry a name the sender chose, NIXL's the sending
# agent's name; tent's carry the sender's segment name. The envelope puts
# the client's name (and, for control messages, a kind) in front of the
# message: magic, kind, name length, name, message.

_MAGIC = b"\x7fTC1"
_HEADER = struct.Struct("<4scH")
KIND_USER = b"N"      # a client's notification
KIND_QUERY = b"Q"     # a control request (Mooncake: first buffer address)
KIND_ANSWER = b"A"    # its answer


def envelope(kind: bytes, name: str, msg: bytes) -> bytes:
    nb = name.encode()
    if len(nb) > 0xFFFF:
        raise ValueError("name too long for a notification")
    return _HEADER.pack(_MAGIC, kind, len(nb)) + nb + msg


def open_envelope(raw: bytes) -> Optional[Tuple[bytes, str, bytes]]:
    """(kind, name, message) of an envelope, None for a plain tent
    notification."""
    if len(raw) < _HEADER.size or not raw.startswith(_MAGIC):
        return None
    _, kind, n = _HEADER.unpack_from(raw)
    start = _HEADER.size
    if len(raw) < start + n:
        return None
    return kind, raw[start:start + n].decode("utf-8", "replace"), raw[start + n:]


def as_bytes(msg: Any) -> bytes:
    if isinstance(msg, str):
        return msg.encode()
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return bytes(msg)
    raise TypeError(f"a notification message is bytes or str, not {type(msg).__name__}")


# ---- request arrays -----------------------------------------------------------


def requests(op: str, segment: tent.Segment, local_addrs: Any, remote_addrs: Any, lengths: Any,
             scratch: Optional["RequestScratch"] = None) -> Any:
    """One request array for ``Engine.transfer`` from three parallel
    sequences of raw addresses/lengths (see ``columns``). With a
    ``scratch``, the rows are written into its buffer (see RequestScratch):
    the array is only valid until the thread's next call, which is all
    ``Engine.transfer`` needs, since it copies them."""
    return request_words(op, segment, columns(local_addrs, remote_addrs, lengths), scratch)


def columns(local_addrs: Any, remote_addrs: Any, lengths: Any) -> Any:
    """The 3 x n uint64 array of (local addresses, remote addresses,
    lengths) from three sequences (lists, tuples, numpy arrays), each
    element taken as Mooncake's bindings take a uintptr_t: a value they
    refuse (a float, a negative number, None, a str, 2**64 or more) raises
    ``_pybind.Mismatch``. Then what tent refuses: lists of different
    lengths, a length of zero, a range running past 2**64
    (``tent.InvalidArgument``); whether the local ranges are registered is
    checked by tent itself, the remote ones by the peer.

    This conversion is the per-call cost the Mooncake calls add to tent's
    own, so the common case (three lists of ints) takes one pass of C loops.
    """
    import numpy as np

    if type(local_addrs) is list and type(remote_addrs) is list and type(lengths) is list:
        n = len(lengths)
        if n and len(local_addrs) == n and len(remote_addrs) == n:
            # The three lists into one buffer of 64-bit words in C loops
            # (array.array, then a numpy view without a copy): a third of
            # what np.array's type discovery costs per batch. "Q" refuses
            # floats (no silent truncation), negative values and values past
            # 2**64; the element-wise path below then decides as the bindings do.
            try:
                words = array.array("Q", local_addrs)
                words.extend(remote_addrs)
                words.extend(lengths)
            except (TypeError, OverflowError):
                words = None
            if words is not None:
                cols = np.frombuffer(words, dtype=np.uint64).reshape(3, n)
                # Below 2**63 each, no range can run past 2**64: one
                # reduction checks all three columns.
                if cols.max() < _U63 and cols[2].all():
                    return cols
                return _checked(np, cols)
    la, ra, ln = (_uint_column(np, x) for x in (local_addrs, remote_addrs, lengths))
    if not (la.shape == ra.shape == ln.shape):
        raise tent.InvalidArgument(
            f"{la.shape[0]} local addresses, {ra.shape[0]} remote addresses and {ln.shape[0]} lengths: "
            "the lists must have one entry each per transfer")
    return _checked(np, np.stack((la, ra, ln)) if la.shape[0] else np.zeros((3, 0), dtype=np.uint64))


def _checked(np: Any, cols: Any) -> Any:
    la, ra, ln = cols[0], cols[1], cols[2]
    if ln.shape[0] and not ln.all():
        raise tent.InvalidArgument(f"transfer {int(np.argmin(ln))}: length 0")
    limit = np.uint64(_U64_MAX) - ln
    if (la > limit).any() or (ra > limit).any():
        raise tent.InvalidArgument("a range runs past 2**64")
    return cols


def _uint_column(np: Any, values: Any) -> Any:
    """A sequence as a 1-D uint64 array, each element as the bindings take
    a uintptr_t (Mismatch for one they refuse). Integer numpy arrays in one
    conversion, anything else element by element."""
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype.kind in "uib":
        if values.dtype.kind == "i" and values.size and values.min() < 0:
            raise _pybind.Mismatch
        return values.astype(np.uint64)
    if type(values) in (list, tuple, range):  # (array.array would read a bytearray's raw bytes)
        try:
            return np.frombuffer(array.array("Q", values), dtype=np.uint64)
        except (TypeError, OverflowError):
            pass
    return np.array([_pybind.uint(v) for v in values], dtype=np.uint64).reshape(-1)


class RequestScratch(threading.local):
    """One request buffer per thread, reused by every call of that thread.

    tent copies a request array when it is submitted, so the buffer is
    free again as soon as ``Engine.transfer`` returns. Reusing it matters:
    a batch submitted from a request array in freshly allocated memory
    was measured 60-200 us slower at 128 requests (two processes, shm) than
    one from memory submitted before, more than building the array costs.
    """

    words: Any = None     # (capacity, 5) uint64
    arrays: Any = None    # n -> ctypes array of n tent.Request over words' first n rows
    filled: Any = None    # (opcode, segment handle) already in every row

    _ARRAYS = 64  # batch sizes remembered; past it, start over

    def take(self, n: int, opcode: int, segment: int) -> Any:
        """(the first n rows as words, the same rows as a ctypes array of
        tent.Request), with opcode and segment written. The ctypes array is
        what ``Engine.transfer`` takes without building a view of a numpy
        array per call; its memory is words', which this scratch keeps."""
        import numpy as np

        if self.words is None or self.words.shape[0] < n:
            _request_words()  # the layout check, once
            self.words = np.empty((max(n, 128), 5), dtype=np.uint64)
            self.arrays = {}
            self.filled = None
        if self.filled != (opcode, segment):
            self.words[:, 0] = opcode  # reserved = 0 (little-endian)
            self.words[:, 2] = segment
            self.filled = (opcode, segment)
        arr = self.arrays.get(n)
        if arr is None:
            if len(self.arrays) >= self._ARRAYS:
                self.arrays.clear()
            arr = self.arrays[n] = (_lib.Request * n).from_address(self.words.ctypes.data)
        return self.words[:n], arr


def request_words(op: str, segment: tent.Segment, cols: Any, scratch: Optional[RequestScratch] = None) -> Any:
    """The request array from a checked 3 x n uint64 array of columns (local
    addresses, remote addresses, lengths): rows of (opcode, local, segment,
    remote, length) words."""
    import numpy as np

    n = cols.shape[1]
    code = tent.WRITE if op == "write" else tent.READ
    if scratch is not None:
        words, reqs = scratch.take(n, code, segment.handle)
        words[:, 1], words[:, 3], words[:, 4] = cols[0], cols[1], cols[2]
        return reqs
    words = np.empty((n, 5), dtype=np.uint64)
    words[:, 1], words[:, 3], words[:, 4] = cols[0], cols[1], cols[2]
    words[:, 0] = code  # opcode, reserved = 0 (little-endian)
    words[:, 2] = segment.handle
    return words.view(_request_words()).reshape(-1)


@functools.lru_cache(maxsize=1)
def _request_words() -> Any:
    """tent.request_dtype, checked (once) to be five little-endian 64-bit words."""
    import sys

    dt = tent.request_dtype
    offsets = {name: dt.fields[name][1] for name in dt.names}
    if (sys.byteorder != "little" or dt.itemsize != 40 or offsets != {
            "opcode": 0, "reserved": 4, "local_addr": 8, "segment": 16, "remote_addr": 24, "length": 32}):
        raise tent.InternalError(f"tent_request's layout is not the one tent.compat writes: {dt}")
    return dt


_U64_MAX = (1 << 64) - 1
_U63 = 1 << 63


def split_host_port(hostname: str) -> Tuple[str, int]:
    """"host", "host:port", "[v6]:port" -> (host, port or 0)."""
    h = hostname.strip()
    if h.startswith("["):
        end = h.find("]")
        if end < 0:
            raise ValueError(f"bad address {hostname!r}")
        host, rest = h[: end + 1], h[end + 1:]
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:] else 0
    if h.count(":") == 1:
        host, port = h.split(":")
        return host, int(port) if port else 0
    return h, 0


def free_port(host: str) -> int:
    """A port free on host right now (for engines whose name is not their
    address, so that get_rpc_port has an answer)."""
    import socket

    bare = host.strip("[]") or "0.0.0.0"
    fam = socket.AF_INET6 if ":" in bare else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((bare, 0))
        return int(s.getsockname()[1])
