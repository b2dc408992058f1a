"""tent's versioned encoding of the blobs clients carry for us (NIXL agent
metadata, serialized descriptor lists, listen-thread frames): never
pickle, so a blob from a peer is data, not code.

    b"TENTBLOB" | version (1 byte) | flags (1 byte) | kind length (1 byte) | kind
    | JSON body | HMAC-SHA256 of everything before it (32 bytes, flag 1)

With a secret (``TENT_COMPAT_SECRET``), every blob is signed and a blob
that is unsigned or signed with another secret is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Optional, Tuple

MAGIC = b"TENTBLOB"
VERSION = 1
_SIGNED = 0x1
_MAC_LEN = 32


class BlobError(ValueError):
    """A blob that is not ours, of another version, or not authentic."""


def encode(kind: str, body: Any, secret: Optional[bytes]) -> bytes:
    k = kind.encode()
    if len(k) > 255:
        raise ValueError("kind too long")
    head = MAGIC + bytes([VERSION, _SIGNED if secret else 0, len(k)]) + k
    out = head + json.dumps(body, separators=(",", ":")).encode()
    if secret:
        out += hmac.new(secret, out, hashlib.sha256).digest()
    return out


def decode(raw: Any, secret: Optional[bytes], want_kind: Optional[str] = None) -> Tuple[str, Any]:
    """(kind, body); BlobError for anything else."""
    if isinstance(raw, str):
        raw = raw.encode("latin-1")
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise BlobError(f"a metadata blob is bytes, not {type(raw).__name__}")
    raw = bytes(raw)
    n = len(MAGIC)
    if len(raw) < n + 3 or not raw.startswith(MAGIC):
        raise BlobError("not a tent metadata blob (a real NIXL/Mooncake peer's metadata cannot be mixed with tent's)")
    version, flags, klen = raw[n], raw[n + 1], raw[n + 2]
    if version != VERSION:
        raise BlobError(f"blob version {version}, this tent speaks {VERSION}")
    kind = raw[n + 3:n + 3 + klen].decode("utf-8", "replace")
    body = raw[n + 3 + klen:]
    if flags & _SIGNED:
        if len(body) < _MAC_LEN:
            raise BlobError("truncated blob")
        body, mac = body[:-_MAC_LEN], body[-_MAC_LEN:]
        if not secret:
            raise BlobError("the blob is signed but no secret is configured here (TENT_COMPAT_SECRET)")
        want = hmac.new(secret, raw[:-_MAC_LEN], hashlib.sha256).digest()
        if not hmac.compare_digest(mac, want):
            raise BlobError("the blob's signature does not match this secret")
    elif secret:
        raise BlobError("the blob is not signed and a secret is configured (TENT_COMPAT_SECRET)")
    if want_kind is not None and kind != want_kind:
        raise BlobError(f"a {kind!r} blob where {want_kind!r} was expected")
    try:
        return kind, json.loads(body)
    except ValueError as exc:
        raise BlobError(f"malformed blob body: {exc}") from None
