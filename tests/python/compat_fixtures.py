"""Test glue for the compat suites: client-shaped peers in their own
processes (tent.compat.clients), a real etcd, the HTTP metadata server as
a process, and free ports."""

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from tent.compat.clients import Peer


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeerProcess(Peer):
    """tent.compat.clients.Peer, with the test's assertion on start."""

    def __init__(self, role, args=(), env=None, timeout=30):
        try:
            super().__init__(role, args, env, timeout)
        except RuntimeError as exc:
            pytest.fail(str(exc))


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


def server_port():
    """A loopback port that was free a moment ago, below the kernel's
    ephemeral range when there is room: every connect and every bind to
    port 0 on the machine draws from that range, so a port from it can be
    taken again before a server binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    if low - 10000 >= 1000:
        for _ in range(100):
            port = random.randrange(10000, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    return free_port()


def _start_etcd(binary, data):
    """etcd on fresh ports; retried on new ports when it exits at start
    (a port taken between the check and etcd's bind)."""
    for attempt in range(5):
        shutil.rmtree(data, ignore_errors=True)
        client = server_port()
        peer = server_port()
        while peer == client:
            peer = server_port()
        proc = subprocess.Popen(
            [binary, "--data-dir", data, "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}", "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        endpoint = f"127.0.0.1:{client}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{endpoint}/health", timeout=1) as r:
                    if b"true" in r.read():
                        return proc, endpoint
            except OSError:
                pass
            if proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail("etcd did not become healthy within 30 s")
            time.sleep(0.1)
    pytest.fail("etcd exited at start five times")


@pytest.fixture(scope="module")
def etcd():
    """A real etcd on free loopback ports; yields its client endpoint."""
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.path.exists(binary):
        pytest.skip("etcd is not installed (tools/deps.sh installs etcd-server)")
    data = tempfile.mkdtemp(prefix="tent-compat-etcd-")
    proc, endpoint = _start_etcd(binary, data)
    try:
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
