"""Test glue for the compat suites: client-shaped peers in their own
processes (tent.compat.clients), a real etcd, the HTTP metadata server as
a process, and free ports."""

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeerProcess:
    """`python -m tent.compat.clients <role>`: JSON lines on stdin/stdout."""

    def __init__(self, role, args=(), env=None, timeout=30):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tent.compat.clients", role, *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
        self.ready = self.read()
        assert self.ready.get("ready"), f"{role} did not start: {self.ready} {self.stderr()}"

    def read(self, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the peer within {timeout or self.timeout} s: {self.stderr()}")
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if r:
                line = self.proc.stdout.readline()
                if not line:
                    raise EOFError(f"the peer exited ({self.proc.poll()}): {self.stderr()}")
                return json.loads(line)

    def call(self, cmd, timeout=None, **kw):
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def quit(self):
        bye = self.call("quit")
        self.proc.wait(timeout=self.timeout)
        return bye

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=self.timeout)

    def stderr(self):
        """The peer's stderr so far (without blocking), for failure messages."""
        if not select.select([self.proc.stderr], [], [], 0)[0]:
            return ""
        return os.read(self.proc.stderr.fileno(), 1 << 16).decode("utf-8", "replace")[-2000:]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=self.timeout)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


@pytest.fixture
def peers():
    """Starts peers and kills whatever a test left running."""
    started = []

    def start(role, *args, env=None):
        p = PeerProcess(role, args, env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


@pytest.fixture(scope="module")
def etcd():
    """A real etcd on free loopback ports; yields its client endpoint."""
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.path.exists(binary):
        pytest.skip("etcd is not installed (tools/deps.sh installs etcd-server)")
    data = tempfile.mkdtemp(prefix="tent-compat-etcd-")
    client, peer = free_port(), free_port()
    proc = subprocess.Popen(
        [binary, "--data-dir", data, "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}", "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"127.0.0.1:{client}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{endpoint}/health", timeout=1) as r:
                    if b"true" in r.read():
                        break
            except OSError:
                pass
            assert proc.poll() is None, "etcd exited"
            assert time.monotonic() < deadline, "etcd did not become healthy"
            time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def http_metadata_server():
    """`python -m tent.compat.http_metadata_server --port 0` as a process;
    yields its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "tent.compat.http_metadata_server", "--host", "127.0.0.1",
                             "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://"), line
        yield line[len("listening on "):]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
