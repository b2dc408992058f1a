"""What the Mooncake and NIXL layers share: the settings read from the
environment, the transport a requested protocol/backend maps to, the
notification envelope, and batches handed to tent as three columns
(tent_transfer_columns) without a Python loop.

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
import ctypes
import os
import struct
from typing import Any, Optional, Tuple

import tent
from tent import _lib
from tent._engine import Batch
from tent._errors import check

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


def spin_wait_ms(default: int) -> int:
    """TENT_COMPAT_SPIN_WAIT_MS: how long NIXL's check_xfer_state may wait
    for a client that polls it in a tight loop (0: it never waits)."""
    v = os.environ.get("TENT_COMPAT_SPIN_WAIT_MS")
    if not v:
        return default
    try:
        ms = int(v)
    except ValueError:
        raise ValueError(f"TENT_COMPAT_SPIN_WAIT_MS={v!r} is not a whole number of milliseconds") from None
    if not 0 <= ms <= 1000:
        raise ValueError(f"TENT_COMPAT_SPIN_WAIT_MS={v!r} is not between 0 and 1000")
    return ms


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


# ---- request columns ----------------------------------------------------------


def column_words(local_addrs: Any, remote_addrs: Any, lengths: Any) -> Tuple[Any, int]:
    """(the 3 x n uint64 array, C-contiguous, of (local addresses, remote
    addresses, lengths), the address of its first word) from three
    sequences (lists, tuples, numpy arrays), each element taken as Mooncake's bindings take a uintptr_t: a value they
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
            # what np.array's type discovery costs per batch. The word type
            # refuses floats (no silent truncation), negative values and
            # values past 2**64; the element-wise path below then decides as
            # the bindings do.
            try:
                words = array.array(_WORD, local_addrs)
                words.extend(remote_addrs)
                words.extend(lengths)
            except (TypeError, OverflowError):
                words = None
            if words is not None:
                cols = np.frombuffer(words, dtype=np.uint64).reshape(3, n)
                # Below 2**63 each, no range can run past 2**64: one
                # reduction checks all three columns.
                if not (cols.max() < _U63 and cols[2].all()):
                    _checked(np, cols)
                # (the view keeps words, and so this address, alive)
                return cols, words.buffer_info()[0]
    la, ra, ln = (_uint_column(np, x) for x in (local_addrs, remote_addrs, lengths))
    if not (la.shape == ra.shape == ln.shape):
        raise tent.InvalidArgument(
            f"{la.shape[0]} local addresses, {ra.shape[0]} remote addresses and {ln.shape[0]} lengths: "
            "the lists must have one entry each per transfer")
    cols = _checked(np, np.stack((la, ra, ln)) if la.shape[0] else np.zeros((3, 0), dtype=np.uint64))
    return cols, int(cols.ctypes.data)


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
            return np.frombuffer(array.array(_WORD, values), dtype=np.uint64)
        except (TypeError, OverflowError):
            pass
    return np.array([_pybind.uint(v) for v in values], dtype=np.uint64).reshape(-1)


# ---- column calls --------------------------------------------------------------
#
# tent_transfer_columns(_sync) take the three columns as they are, so a
# batch costs one C call and no request array: nothing per request is done
# in Python. The arguments are ctypes objects for the untyped functions
# (_lib.UNTYPED): a pointer is a c_void_p of its address.

_OPCODE_ARGS = {"read": ctypes.c_uint32(tent.READ), "write": ctypes.c_uint32(tent.WRITE)}  # never modified
NO_OPTS = (None, None)  # transfer_options() of no notify and no transport


def transfer_options(engine: tent.Engine, notify: Optional[bytes], transport: Optional[str]) -> Tuple[Any, Any]:
    """(the opts argument of a column call: None or a pointer to
    tent_transfer_options, what must stay alive until the call returned)."""
    if notify is None and transport is None:
        return NO_OPTS
    opts, keep = engine._transfer_options(None, notify, transport)
    assert opts is not None  # a notify or a transport was given
    return ctypes.byref(opts), (opts, keep)


def _column_args(engine: tent.Engine, op: str, segment: tent.Segment, addr: int, n: int) -> Tuple[Any, ...]:
    if engine._handle is None:
        engine._h()  # raises InvalidHandle
    seg = segment._handle
    if seg is None:
        seg = segment.handle  # raises InvalidHandle
    return (engine._handle_arg, _OPCODE_ARGS[op], ctypes.c_void_p(seg), ctypes.c_void_p(addr),
            ctypes.c_void_p(addr + 8 * n), ctypes.c_void_p(addr + 16 * n), ctypes.c_size_t(n))


def transfer_columns_sync(engine: tent.Engine, op: str, segment: tent.Segment, cols: Any, addr: int,
                          opts: Tuple[Any, Any] = NO_OPTS) -> None:
    """The batch of the 3 x n columns at addr (from column_words; cols
    keeps them alive), submitted and waited for in one call
    (tent_transfer_columns_sync). Raises the call's or the first failed
    request's error."""
    n = cols.shape[1]
    st = engine._fast.tent_transfer_columns_sync(*_column_args(engine, op, segment, addr, n), opts[0], None)
    del opts
    if st < 0:
        check(st)


def transfer_columns(engine: tent.Engine, op: str, segment: tent.Segment, cols: Any, addr: int,
                     opts: Tuple[Any, Any] = NO_OPTS) -> tent.Batch:
    """The batch of the columns, submitted (tent_transfer_columns): its
    tent.Batch, as ``Engine.transfer`` returns it."""
    n = cols.shape[1]
    out = ctypes.c_void_p()
    st = engine._fast.tent_transfer_columns(*_column_args(engine, op, segment, addr, n), opts[0],
                                            ctypes.byref(out))
    del opts
    bh = out.value
    if bh is None:  # the call failed: nothing was submitted
        check(st if st < 0 else _lib.TENT_ERR_INTERNAL)
    # A failed request is wait()'s to raise; out is the handle's argument
    # for the untyped calls, as Engine.transfer passes it.
    return Batch(engine, bh, n, st == _lib.TENT_OK, out)  # type: ignore[arg-type]


_U64_MAX = (1 << 64) - 1
_U63 = 1 << 63
# The array type of a 64-bit unsigned word: "L" (unsigned long) where it is
# 64 bits, as on Linux x86-64 and arm64, converts a list of ints 2-3x faster
# than "Q" (unsigned long long), which CPython converts through a slower path.
_WORD = "L" if array.array("L").itemsize == 8 else "Q"


def _is_ipv6(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.IPv6Address(text)  # a scope ("fe80::1%eth0") included
    except ValueError:
        return False
    return True


def split_host_port(hostname: str) -> Tuple[str, int]:
    """"host", "host:port", "[v6]:port", and IPv6 addresses the way
    Mooncake reads them: a bare one ("::1", "fe80::1%eth0") has no port,
    one with a scope may be followed by ":port" -> (host, port or 0), an
    IPv6 host in brackets so that f"{host}:{port}" is an address."""
    h = hostname.strip()
    if h.startswith("["):
        end = h.find("]")
        if end < 0:
            raise ValueError(f"bad address {hostname!r}")
        host, rest = h[: end + 1], h[end + 1:]
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:] else 0
    scope = h.find("%")
    if scope >= 0:  # a scope ends at the first colon after it, which starts a port
        colon = h.find(":", scope)
        host = h if colon < 0 else h[:colon]
        if _is_ipv6(host):
            return f"[{host}]", int(h[colon + 1:]) if colon >= 0 and h[colon + 1:] else 0
    elif _is_ipv6(h):
        return f"[{h}]", 0
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
