"""Client of Mooncake's HTTP metadata protocol: a key-value store at one
URL, ``GET``/``PUT``/``DELETE <url>?key=<key>`` (200 with the value, 404
when the key is missing, 400 for no key). Any server speaking it serves
(Mooncake's ``mooncake_http_metadata_server``, or
``python -m tent.compat.http_metadata_server``).

tent itself has no HTTP directory: a Mooncake engine initialized with
``http://host:port/metadata`` runs tent's peer-to-peer metadata and
publishes, under ``tent/compat/segments/<segment name>``, a small JSON
record naming the tent address that serves that segment; peers resolve a
segment name through it before opening the segment.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional

KEY_PREFIX = "tent/compat/segments/"
RECORD_VERSION = 1


class HTTPMetadataClient:
    """GET/PUT/DELETE of keys at one Mooncake-style metadata URL."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"{url!r} is not an http(s)://host:port/path metadata URL")
        self.url = url.split("?", 1)[0]
        self.timeout = timeout

    def _call(self, method: str, key: str, body: Optional[bytes] = None) -> Optional[bytes]:
        if not key:
            raise ValueError("a metadata key is required")
        req = urllib.request.Request(f"{self.url}?key={urllib.parse.quote(key, safe='')}", data=body,
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise ConnectionError(f"metadata server {self.url}: {method} {key!r}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectionError(f"metadata server {self.url}: {method} {key!r}: {exc}") from exc

    def get(self, key: str) -> Optional[bytes]:
        """The value, or None when the key is missing."""
        return self._call("GET", key)

    def put(self, key: str, value: bytes) -> None:
        self._call("PUT", key, value)

    def delete(self, key: str) -> bool:
        """True if the key existed."""
        return self._call("DELETE", key) is not None

    # -- segment records --

    def publish_segment(self, segment: str, tent_address: str) -> None:
        record = {"version": RECORD_VERSION, "tent_address": tent_address}
        self.put(KEY_PREFIX + segment, json.dumps(record).encode())

    def resolve_segment(self, segment: str) -> Optional[str]:
        """The tent address serving segment, None when nothing is published."""
        raw = self.get(KEY_PREFIX + segment)
        if raw is None:
            return None
        try:
            record = json.loads(raw)
            if record.get("version") != RECORD_VERSION:
                raise ValueError(f"record version {record.get('version')!r}, expected {RECORD_VERSION}")
            addr = record["tent_address"]
            if not isinstance(addr, str):
                raise ValueError("tent_address is not a string")
            return addr
        except (ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"metadata server {self.url}: bad record for segment {segment!r}: {exc}") from exc

    def withdraw_segment(self, segment: str) -> None:
        self.delete(KEY_PREFIX + segment)
