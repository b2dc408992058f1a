"""Fixtures of the tent Python suite.

`make test-python` runs this suite against the tent wheel installed in a
fresh venv (build/venv-test), never against python/ in the source tree.
TENT_SOURCE_DIR (set by the Makefile; else found from this file's path)
is the repository, for include/tent.h; TENT_WHEEL is the wheel under test.
"""

import os
import subprocess
import sys

import pytest

import tent

# Skipped tests are recorded for make test's summary (skiplog.py).
pytest_plugins = ["skiplog"]

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("TENT_SOURCE_DIR") or os.path.normpath(os.path.join(HERE, "..", ".."))

# The counts that must be back to zero when a test released everything.
LEAK_COUNTS = ("regions", "registered_bytes", "reservations", "handles", "segments", "batches",
               "requests_in_flight", "allocations")


def leaks(engine):
    """The non-zero resource counts of an engine ({} when clean)."""
    s = engine.stats()
    return {k: s[k] for k in LEAK_COUNTS if s[k]}


@pytest.fixture
def engine():
    """A fresh engine, checked to hold nothing at the end of the test."""
    with tent.Engine(timeout=10) as e:
        yield e
        assert leaks(e) == {}, "the test left resources registered or open"


@pytest.fixture
def self_segment(engine):
    """The engine's own segment (transfers use the local transport)."""
    with engine.open_segment(engine.name) as s:
        yield s


@pytest.fixture(scope="session")
def transports():
    """Every transport libtent installs by default here."""
    with tent.Engine() as e:
        return e.transports


def cross_process_transports():
    """Transports that move host memory between processes (not local,
    which is same-process, nor cuda, which moves GPU memory)."""
    with tent.Engine() as e:
        return [t for t in e.transports if t not in ("local", "cuda")]


def has_gpu():
    return bool(tent.topology().get("gpus"))


class Peer:
    """`python -m tent peer` in another process: allocates size bytes and
    answers crc/fill/zero/stats commands (see tent._cli)."""

    def __init__(self, size=1 << 20, timeout=20, secret=None):
        from tent._cli import Peer as CliPeer

        self._p = CliPeer(size, timeout=timeout, secret=secret)
        self.name, self.addr, self.size, self.proc = self._p.name, self._p.addr, self._p.size, self._p.proc

    def call(self, cmd, **kw):
        return self._p.call(cmd, **kw)

    def close(self):
        self._p.close()


@pytest.fixture
def peer():
    p = Peer()
    try:
        yield p
    finally:
        p.close()


def run_python(code, timeout=60, env=None):
    """Runs code in a fresh interpreter; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=HERE)
