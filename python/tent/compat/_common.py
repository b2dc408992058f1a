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

import os
import struct
from typing import Any, List, Optional, Sequence, Tuple

import tent

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


def requests(op: str, segment: tent.Segment, local_addrs: Sequence[int], remote_addrs: Sequence[int],
             lengths: Sequence[int]) -> Any:
    """One request array for ``Engine.transfer`` from three parallel
    sequences of raw addresses/lengths (numpy, vectorized)."""
    import numpy as np

    la = np.asarray(local_addrs, dtype=np.uint64).reshape(-1)
    ra = np.asarray(remote_addrs, dtype=np.uint64).reshape(-1)
    ln = np.asarray(lengths, dtype=np.uint64).reshape(-1)
    if not (la.shape == ra.shape == ln.shape):
        raise tent.InvalidArgument(
            f"{la.shape[0]} local addresses, {ra.shape[0]} remote addresses and {ln.shape[0]} lengths: "
            "the lists must have one entry each per transfer")
    return tent.make_requests(op, 0, segment, 0, local_offsets=la, remote_offsets=ra, lengths=ln)


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


def flat(xs: Any) -> List[int]:
    return [int(x) for x in xs]
