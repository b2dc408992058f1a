"""A minimal etcd v3 key-value client over etcd's JSON gateway
(``POST /v3/kv/put|range|deleterange``, keys and values base64), standard
library only: enough to keep NIXL agent metadata in etcd
(``NIXL_ETCD_ENDPOINTS``)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import List, Optional


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


class EtcdKV:
    def __init__(self, endpoints: str, timeout: float = 5.0) -> None:
        self.endpoints: List[str] = []
        for ep in endpoints.split(","):
            ep = ep.strip().rstrip("/")
            if not ep:
                continue
            if "://" not in ep:
                ep = "http://" + ep
            self.endpoints.append(ep)
        if not self.endpoints:
            raise ValueError(f"no etcd endpoint in {endpoints!r}")
        self.timeout = timeout

    def _post(self, path: str, body: dict) -> dict:
        last: Optional[Exception] = None
        for ep in self.endpoints:
            req = urllib.request.Request(ep + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read() or b"{}")
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = exc
        raise ConnectionError(f"etcd {','.join(self.endpoints)}: {path}: {last}")

    def put(self, key: str, value: bytes) -> None:
        self._post("/v3/kv/put", {"key": _b64(key.encode()), "value": _b64(value)})

    def get(self, key: str) -> Optional[bytes]:
        kvs = self._post("/v3/kv/range", {"key": _b64(key.encode())}).get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def delete(self, key: str) -> bool:
        return int(self._post("/v3/kv/deleterange", {"key": _b64(key.encode())}).get("deleted", 0)) > 0
