"""A small server of Mooncake's HTTP metadata protocol, for tests and
single-node deployments (standard library only, in memory, threaded)::

    python -m tent.compat.http_metadata_server --host 127.0.0.1 --port 8080

serves ``http://127.0.0.1:8080/metadata``: ``GET``/``PUT``/``DELETE
/metadata?key=K`` (200 with the value, 404 for a missing key, 400 without
a key, 405 for other methods or paths). With ``--port 0`` it picks a port;
the first line on stdout is always ``listening on http://HOST:PORT/metadata``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional, Tuple

MAX_VALUE = 16 << 20  # a segment record is tiny; refuse what is not one


class MetadataStore:
    """The key-value map, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: Dict[str, bytes] = {}

    def get(self, key: str) -> Optional[bytes]:
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, value: bytes) -> bool:
        """Stores value; False (nothing stored) for a second PUT of an
        ``rpc_meta`` key, which Mooncake's server refuses: that record names
        the engine serving a segment, and a second engine claiming the same
        name must not replace it."""
        with self._lock:
            if "rpc_meta" in key and key in self._data:
                return False
            self._data[key] = value
            return True

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._data.pop(key, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


def _handler(store: MetadataStore, path: str, log_requests: bool = False) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
            if log_requests:
                super().log_message(format, *args)

        def _reply(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            self.wfile.write(body)

        def _key(self) -> Optional[str]:
            url = urllib.parse.urlsplit(self.path)
            if url.path != path:
                self._reply(405, b"method not allowed")
                return None
            key = urllib.parse.parse_qs(url.query).get("key", [""])[0].strip()
            if not key:
                self._reply(400, b"metadata key is required")
                return None
            return key

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            key = self._key()
            if key is None:
                return
            value = store.get(key)
            if value is None:
                self._reply(404, b"metadata not found")
            else:
                self._reply(200, value)

        def do_PUT(self) -> None:  # noqa: N802
            key = self._key()
            if key is None:
                return
            try:
                n = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                n = -1
            if not 0 <= n <= MAX_VALUE:
                self._reply(400, b"bad Content-Length")
                return
            value = self.rfile.read(n)
            if not store.put(key, value):
                self._reply(400, b"Duplicate rpc_meta key not allowed")
                return
            self._reply(200, b"metadata updated")

        def do_DELETE(self) -> None:  # noqa: N802
            key = self._key()
            if key is None:
                return
            if store.delete(key):
                self._reply(200, b"metadata deleted")
            else:
                self._reply(404, b"metadata not found")

        def do_POST(self) -> None:  # noqa: N802
            self._reply(405, b"method not allowed")

    return Handler


class HTTPMetadataServer:
    """The server on a thread: ``start()``, ``url``, ``close()``; also a
    context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, path: str = "/metadata",
                 log_requests: bool = False) -> None:
        self.store = MetadataStore()
        self._httpd = ThreadingHTTPServer((host, port), _handler(self.store, path, log_requests))
        self._httpd.daemon_threads = True
        self._path = path
        self._thread: Optional[threading.Thread] = None

    @property
    def address(self) -> Tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}{self._path}"

    def start(self) -> "HTTPMetadataServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="tent-http-metadata", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> "HTTPMetadataServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tent.compat.http_metadata_server",
                                description="Mooncake's HTTP metadata protocol, served in memory")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--path", default="/metadata")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                   help="accepted as by Mooncake's server; at DEBUG each request is logged to stderr")
    args = p.parse_args(argv)
    server = HTTPMetadataServer(args.host, args.port, args.path, log_requests=args.log_level == "DEBUG")
    print(f"listening on {server.url}", flush=True)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM ends the server cleanly (exit 0), as SIGINT does

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
