"""Two Python processes moving numpy arrays over each available transport,
with checksums; authentication; deadlines; fork, spawn and forkserver."""

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tent

import mp_workers
from conftest import HERE, Peer, cross_process_transports, leaks

SIZE = 1 << 20
BLOCK = 16 << 10


@pytest.fixture(scope="module")
def spawn():
    return multiprocessing.get_context("spawn")


@pytest.mark.parametrize("transport", cross_process_transports())
def test_numpy_arrays_between_two_processes(spawn, transport):
    parent_conn, child_conn = spawn.Pipe()
    child = spawn.Process(target=mp_workers.numpy_peer, args=(child_conn, SIZE))
    child.start()
    try:
        hello = parent_conn.recv() if parent_conn.poll(60) else pytest.fail("the peer did not start")
        assert transport in hello["transports"]
        with tent.Engine(timeout=20) as e:
            src = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8)
            dst = np.zeros(SIZE, np.uint8)
            with e.register(src) as rs, e.register(dst) as rd, e.open_segment(hello["name"]) as seg:
                offs = np.arange(SIZE // BLOCK) * BLOCK
                for target in ("registered", "alloc"):
                    remote = hello[target]
                    # WRITE, one batch of 64 requests, reversed order remotely
                    reqs = tent.make_requests("write", rs, seg, remote, local_offsets=offs,
                                              remote_offsets=offs[::-1].copy(), lengths=BLOCK)
                    with e.transfer(reqs, transport=transport) as batch:
                        batch.wait(30)
                        results = batch.status()
                    assert {r.transport for r in results} == {transport}
                    assert sum(r.bytes for r in results) == SIZE and not any(r.retried for r in results)
                    parent_conn.send(("sha", target))
                    want = mp_workers.sha(np.ascontiguousarray(src.reshape(-1, BLOCK)[::-1]))
                    assert parent_conn.recv() == want, f"{transport} WRITE to {target}: checksum differs"

                    # READ everything back (synchronous form)
                    parent_conn.send(("fill", target, 11))
                    remote_sha = parent_conn.recv()
                    dst[:] = 0
                    res = e.read(rd, seg, remote, transport=transport)
                    assert res.transport == transport and res.bytes == SIZE
                    assert mp_workers.sha(dst) == remote_sha, f"{transport} READ from {target}: checksum differs"

                    # WRITE in the synchronous form, part of the region
                    e.write((rs, 4096), seg, remote + 4096, 8192, transport=transport)
                    parent_conn.send(("fill", target, 12))  # (checked through a READ below)
                    parent_conn.recv()
                stats = e.stats()
                assert transport in stats["transports"]
            assert leaks(e) == {}
        parent_conn.send(("quit",))
        assert parent_conn.recv() == {}, "the peer leaked"
        child.join(30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join()


def test_shm_is_tested_when_present():
    with tent.Engine() as e:
        names = e.transports
    if "shm" not in names:
        pytest.skip(f"shm is not compiled into this libtent (transports: {names})")
    assert "shm" in cross_process_transports()


def test_wrong_secret_is_refused_across_processes():
    p = Peer(4096, secret="right")
    try:
        with tent.Engine(secret=b"wrong") as e:
            with pytest.raises(tent.AuthError):
                e.open_segment(p.name)
        with tent.Engine() as e:
            with pytest.raises(tent.AuthError):
                e.open_segment(p.name)
        with tent.Engine(secret="right") as e, e.open_segment(p.name) as seg:
            buf = bytearray(b"x" * 4096)
            with e.register(buf) as r:
                e.write(r, seg, p.addr)
    finally:
        p.close()


def wait_until_stopped(pid, timeout=10):
    """Until /proc says every thread of pid is stopped (state T)."""
    deadline = time.monotonic() + timeout
    while True:
        states = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.add(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that just exited
                pass
        if states == {"T"}:
            return
        assert time.monotonic() < deadline, f"pid {pid} did not stop: thread states {states}"
        time.sleep(0.01)


def test_deadlines_with_a_stopped_peer():
    """Nothing waits forever: a peer that stops answering times out."""
    p = Peer(1 << 20)
    try:
        with tent.Engine(timeout=2) as e:
            seg = e.open_segment(p.name)
            buf = np.zeros(1 << 20, np.uint8)
            with e.register(buf) as r:
                # tcp: the peer's process serves each request (shm would copy
                # from its mapping without it, stopped or not)
                e.write(r, seg, p.addr, transport="tcp")  # warm: connections are up
                os.kill(p.proc.pid, signal.SIGSTOP)
                wait_until_stopped(p.proc.pid)  # kill() returns before the peer stops
                try:
                    reqs = tent.make_requests("read", r, seg, p.addr, local_offsets=[0], lengths=1 << 20)
                    t0 = time.monotonic()
                    with e.transfer(reqs, timeout=1.5, transport="tcp") as b:
                        with pytest.raises(tent.Timeout) as info:
                            b.wait(0.2)  # still running: the wait times out
                        assert not b.done and b.status()[0].pending
                        assert isinstance(info.value, TimeoutError)
                        with pytest.raises(tent.TentError) as info:
                            b.wait()  # until the batch's own deadline
                        assert b.done and not b.status()[0].ok
                    assert time.monotonic() - t0 < 10
                finally:
                    os.kill(p.proc.pid, signal.SIGCONT)
            seg.close()
            assert leaks(e) == {}
    finally:
        p.close()


def run_scenario(name):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "fork_scenarios.py"), name],
                          capture_output=True, text=True, timeout=120, cwd=HERE)
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def test_import_then_fork_is_safe():
    run_scenario("import_then_fork")


def test_fork_after_use_raises_fork_error():
    run_scenario("fork_after_use")


def test_spawn_and_forkserver_workers():
    run_scenario("spawn_and_forkserver")


def test_fork_pool_in_a_program_that_only_imported_tent():
    run_scenario("pool_fork_with_unused_import")
