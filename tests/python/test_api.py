"""Every public API in one process: engines, registration, allocation,
segments, synchronous and batched transfers, notifications, stats,
uninstall, topology, versions, and cleanup by context managers (also when
an exception leaves the block)."""

import ctypes
import gc
import hashlib
import threading

import numpy as np
import pytest

import tent

from conftest import leaks


def digest(a):
    return hashlib.sha256(memoryview(a).cast("B")).hexdigest()


def test_version_and_topology():
    assert tent.version() == tent.__version__
    major, minor, patch = tent.version_info()
    assert (major, minor) == (0, 1)
    topo = tent.topology()
    assert isinstance(topo["gpus"], list)


def test_engine_basics():
    e = tent.Engine(timeout=5, unregister_timeout=1, tcp_streams=2, transports=["local", "tcp"])
    try:
        assert ":" in e.name  # the listener's host:port
        assert e.transports == ["local", "tcp"]
        assert repr(e).startswith("<tent.Engine")
        s = e.stats()
        assert s["regions"] == 0 and s["handles"] == 0 and "transports" in s
        assert s["process_handles"] >= 1
    finally:
        e.close()
    e.close()  # idempotent
    assert e.closed and repr(e) == "<tent.Engine closed>"
    with pytest.raises(tent.InvalidHandle):
        e.stats()


def test_engine_context_manager_closes_on_exception():
    with pytest.raises(RuntimeError):
        with tent.Engine() as e:
            e.register(np.zeros(64, np.uint8))
            raise RuntimeError("boom")
    assert e.closed


def test_engine_with_secret():
    # (and across processes: test_processes.py)
    with tent.Engine(secret=b"s3cret") as a, tent.Engine(secret="s3cret") as b:
        with b.open_segment(a.name):
            pass
        with tent.Engine(secret=b"wrong") as c, tent.Engine() as d:
            for other in (c, d):
                with pytest.raises(tent.AuthError):
                    other.open_segment(a.name)


def test_register_keeps_the_object_alive(engine):
    buf = bytearray(4096)
    region = engine.register(buf)
    assert region.addr == ctypes.addressof((ctypes.c_char * 4096).from_buffer(buf))
    assert region.size == len(region) == 4096
    info = region.info()
    assert (info.addr, info.size, info.location, info.remote_read, info.remote_write) == (
        region.addr, 4096, "cpu", True, True)
    with pytest.raises(BufferError):  # bytearray can't resize while registered
        buf.extend(b"x")
    del buf
    gc.collect()
    assert engine.stats()["regions"] == 1
    region.close()
    region.close()
    assert region.closed and engine.stats()["regions"] == 0


def test_register_flags_and_location(engine):
    a = np.zeros(1024, np.uint8)
    with engine.register(a, location="cpu", remote_read=True, remote_write=False) as r:
        info = r.info()
        assert info.remote_read and not info.remote_write
        assert r.location == "cpu"


def test_region_context_manager_unregisters_on_exception(engine):
    a = np.zeros(1 << 16, np.uint8)
    with pytest.raises(KeyError):
        with engine.register(a):
            assert engine.stats()["regions"] == 1
            raise KeyError("boom")
    assert leaks(engine) == {}


def test_register_batch_all_or_nothing(engine):
    arrays = [np.zeros(4096, np.uint8) for _ in range(8)]
    regions = engine.register_batch(arrays)
    assert [r.addr for r in regions] == [a.ctypes.data for a in arrays]
    assert engine.stats()["regions"] == 8
    engine.unregister_batch(regions)
    assert all(r.closed for r in regions) and engine.stats()["regions"] == 0

    # one bad item (overlapping another) -> nothing registered
    a = np.zeros(8192, np.uint8)
    with pytest.raises(tent.InvalidArgument):
        engine.register_batch([a, a[4096:], np.zeros(16, np.uint8)])
    assert engine.stats()["regions"] == 0
    # an item overlapping an existing registration -> nothing registered
    with engine.register(a[:4096]):
        with pytest.raises(tent.Overlap):
            engine.register_batch([np.zeros(64, np.uint8), a])
        assert engine.stats()["regions"] == 1
    # (object, location) pairs
    regions = engine.register_batch([(arrays[0], "cpu"), (arrays[1], None)])
    for r in regions:
        r.close()
    assert engine.register_batch([]) == []


def test_alloc_view_and_numpy(engine):
    with engine.alloc(1 << 20) as region:
        assert isinstance(region, tent.AllocatedRegion)
        assert region.size == 1 << 20 and region.info().location == "cpu"
        s = engine.stats()
        assert s["allocations"] == 1 and s["regions"] == 1
        v = region.view()
        assert len(v) == 1 << 20 and not v.readonly and v.format == "B"
        v[:5] = b"hello"
        arr = region.numpy(np.uint32, (-1,))
        assert arr.nbytes == 1 << 20
        assert bytes(region.numpy()[:5]) == b"hello"
        # freeing under live views would leave them dangling: refused
        with pytest.raises(BufferError):
            region.close()
        with pytest.raises(BufferError):
            engine.close()
        del arr
        v.release()
    assert region.closed
    assert leaks(engine) == {}
    with pytest.raises(tent.InvalidHandle):
        region.view()


def test_alloc_finalizer_with_live_view_keeps_memory():
    with tent.Engine() as engine:
        region = engine.alloc(4096)
        view = region.view()
        del region
        gc.collect()
        view[:4] = b"safe"  # still mapped: the engine parked the allocation
        assert bytes(view[:4]) == b"safe"
        assert engine.stats()["allocations"] == 1
        with pytest.raises(BufferError):
            engine.close()
        view.release()
    assert engine.closed


def test_sync_write_and_read(engine, self_segment):
    src = np.arange(1 << 16, dtype=np.uint8)
    dst = np.zeros_like(src)
    with engine.register(src) as rs, engine.register(dst) as rd:
        res = engine.write(rs, self_segment, rd.addr)
        assert res.ok and res.code == 0 and res.transport == "local" and res.bytes == src.nbytes
        assert not res.retried and not res.staged and res.error is None
        assert np.array_equal(src, dst)
        dst[:] = 0
        res = engine.read(rd, self_segment, rs.addr, 1000)
        assert res.bytes == 1000 and np.array_equal(dst[:1000], src[:1000]) and not dst[1000:].any()
        # (Region, offset) and (address, length) and the buffer object itself
        dst[:] = 0
        engine.write((rs, 100), self_segment, rd.addr + 100, 50)
        assert np.array_equal(dst[100:150], src[100:150]) and not dst[:100].any() and not dst[150:].any()
        engine.write((src.ctypes.data + 10, 10), self_segment, rd.addr + 10)
        assert np.array_equal(dst[10:20], src[10:20])
        dst[:] = 0
        engine.write(src, self_segment, rd.addr, timeout=5, transport="local")
        assert np.array_equal(dst, src)


def test_batch_with_make_requests(engine, self_segment):
    n, block = 128, 512
    src = np.random.default_rng(1).integers(0, 255, n * block, dtype=np.uint8)
    dst = np.zeros_like(src)
    with engine.register(src) as rs, engine.register(dst) as rd:
        offs = np.arange(n, dtype=np.int64) * block
        reqs = tent.make_requests("write", rs, self_segment, rd.addr, local_offsets=offs, lengths=block)
        assert reqs.dtype == tent.request_dtype and reqs.shape == (n,)
        assert int(reqs["local_addr"][3]) == rs.addr + 3 * block
        with engine.transfer(reqs) as batch:
            assert len(batch) == n
            batch.wait(timeout=10)
            assert batch.done and batch.completed == n
            results = batch.status()
            assert len(results) == n and all(r.ok and r.transport == "local" and r.bytes == block for r in results)
            arr = batch.status_array()
            assert arr.dtype == tent.status_dtype and (arr["status"] == 0).all() and (arr["bytes"] == block).all()
        assert batch.closed
        assert np.array_equal(src, dst)
        # reversed: read, with different remote offsets
        dst[:] = 0
        reqs = tent.make_requests(tent.READ, rd, self_segment, rs.addr, local_offsets=offs[::-1].copy(),
                                  remote_offsets=offs, lengths=np.full(n, block))
        with engine.transfer(reqs, timeout=5, notify=b"done", transport="local") as batch:
            batch.wait()
        assert np.array_equal(dst.reshape(n, block)[::-1], src.reshape(n, block))
        assert engine.recv_notification(timeout=5) == (engine.name, b"done")
    assert engine.stats()["batches"] == 0


def test_request_array_transferred_again(engine, self_segment):
    """A request array used again moves what it holds now; the engine's
    view of it goes with the array, and numpy will not move its memory
    (resize in place) while the view exists."""
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros_like(src)
    with engine.register(src) as rs, engine.register(dst) as rd:
        reqs = tent.make_requests("write", rs, self_segment, rd.addr, local_offsets=[0], lengths=64)
        for i in range(3):
            reqs["local_addr"] = rs.addr + 64 * i
            reqs["remote_addr"] = rd.addr + 128 * i
            with engine.transfer(reqs) as b:
                b.wait()
                assert b.done and b.status()[0].bytes == 64
            assert np.array_equal(dst[128 * i:128 * i + 64], src[64 * i:64 * i + 64])
        assert id(reqs) in engine._request_views
        with pytest.raises(ValueError):
            reqs.resize(1000)  # would move the memory the view points at
        del reqs
        gc.collect()
        assert len(engine._request_views) == 0
        # many arrays, each used once: the engine remembers a bounded number
        keep = [tent.make_requests("write", rs, self_segment, rd.addr, local_offsets=[i], lengths=1)
                for i in range(300)]
        for r in keep:
            with engine.transfer(r) as b:
                b.wait()
        assert 0 < len(engine._request_views) <= 256
        assert np.array_equal(dst[:300], src[:300])


def test_ctypes_request_array_used_again(engine, self_segment):
    """A ctypes request array used again moves what it holds now; the
    engine remembers it (weakly) like a numpy one, but not an instance of
    a subclass (whose length may change)."""
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros_like(src)
    with engine.register(src) as rs, engine.register(dst) as rd:
        reqs = (tent.Request * 2)()
        for i in range(3):
            for j in range(2):
                reqs[j] = tent.Request(tent.WRITE, 0, rs.addr + 64 * (2 * i + j), self_segment.handle,
                                       rd.addr + 256 * i + 128 * j, 64)
            with engine.transfer(reqs) as b:
                b.wait()
                assert [s.bytes for s in b.status()] == [64, 64]
            for j in range(2):
                k = 2 * i + j
                assert np.array_equal(dst[256 * i + 128 * j:256 * i + 128 * j + 64], src[64 * k:64 * k + 64])
        assert id(reqs) in engine._request_views
        del reqs, b
        gc.collect()
        assert len(engine._request_views) == 0

        class Requests(tent.Request * 1):
            pass

        one = Requests(tent.Request(tent.WRITE, 0, rs.addr, self_segment.handle, rd.addr + 4000, 64))
        with engine.transfer(one) as b:
            b.wait()
        assert id(one) not in engine._request_views
        assert np.array_equal(dst[4000:4064], src[:64])


def test_wait_of_a_batch_finished_when_submitted():
    """A local batch is usually done when transfer() returns; wait() then
    needs no call, but still refuses a closed batch or engine and checks
    its timeout."""
    e = tent.Engine()
    src = np.arange(64, dtype=np.uint8)
    dst = np.zeros_like(src)
    rs, rd, seg = e.register(src), e.register(dst), e.open_segment(e.name)
    reqs = tent.make_requests("write", rs, seg, rd.addr, local_offsets=[0], lengths=64)
    b = e.transfer(reqs)
    if b._succeeded:  # the library said so: the data is there before any wait
        assert b.done and np.array_equal(src, dst)
    b.wait()
    assert np.array_equal(src, dst)
    b.wait(timeout=1)
    with pytest.raises(TypeError):
        b.wait(timeout="1")
    b.close()
    with pytest.raises(tent.InvalidHandle):
        b.wait()
    b = e.transfer(reqs)
    with pytest.raises(ValueError):
        reqs.resize(2)  # the engine's view of it must not dangle
    e.close()
    with pytest.raises(tent.InvalidHandle):
        b.wait()
    reqs.resize(2)  # the engine is gone, and its views with it
    assert reqs.shape == (2,)


def test_sync_results_of_each_call(engine, self_segment):
    """engine.write/read return each call's own result (equal results may
    be one object: they are immutable)."""
    src = np.ones(8192, np.uint8)
    dst = np.zeros_like(src)
    with engine.register(src) as rs, engine.register(dst) as rd:
        for n in (1, 7, 64, 8192, 7, 1):
            w = engine.write(rs, self_segment, rd.addr, n)
            r = engine.read(rd, self_segment, rs.addr, n)
            assert (w.bytes, r.bytes, w.transport, w.code) == (n, n, "local", 0)
        for n in range(1, 200):  # more distinct results than a thread keeps
            assert engine.write(rs, self_segment, rd.addr, n).bytes == n


def test_batch_from_ctypes_array_and_tuples(engine, self_segment):
    src = bytearray(b"abcdefgh" * 8)
    dst = bytearray(64)
    with engine.register(src) as rs, engine.register(dst) as rd:
        arr = (tent.Request * 2)()
        arr[0] = tent.Request(tent.WRITE, 0, rs.addr, self_segment.handle, rd.addr, 32)
        arr[1] = tent.Request(tent.WRITE, 0, rs.addr + 32, self_segment.handle, rd.addr + 32, 32)
        with engine.transfer(arr) as b:
            b.wait()
        assert dst == src
        dst[:] = bytes(64)
        with engine.transfer([("write", rs, self_segment, rd.addr, 64)]) as b:
            b.wait()
        assert dst == src


def test_batch_failure_is_per_request(engine, self_segment):
    src = np.ones(4096, np.uint8)
    dst = np.zeros(4096, np.uint8)
    with engine.register(src) as rs, engine.register(dst, remote_write=False) as rd:
        reqs = tent.make_requests("write", rs, self_segment, rd.addr, local_offsets=[0, 1024], lengths=1024)
        with engine.transfer(reqs) as b:
            with pytest.raises(tent.PermissionDenied):
                b.wait()
            results = b.status()
            assert all(r.code == tent.PermissionDenied.code for r in results)
            assert isinstance(results[0].error, tent.PermissionDenied)
        with pytest.raises(tent.PermissionDenied):
            engine.write(rs, self_segment, rd.addr)
        # out of the peer's registered range
        with pytest.raises((tent.OutOfRange, tent.NotRegistered)):
            engine.write(rs, self_segment, rd.addr + 1)


def test_batch_closed_on_exception(engine):
    src = np.ones(4096, np.uint8)
    with engine.register(src) as r, engine.open_segment(engine.name) as self_segment:
        with pytest.raises(ZeroDivisionError):
            with engine.transfer([("write", r, self_segment, r.addr, 16)]):
                1 / 0
    assert leaks(engine) == {}


def test_segment_context_manager(engine):
    with pytest.raises(RuntimeError):
        with engine.open_segment(engine.name) as seg:
            assert seg.name == engine.name and engine.stats()["segments"] == 1
            raise RuntimeError
    assert seg.closed and engine.stats()["segments"] == 0
    with engine.open_segment(engine) as seg:  # an Engine is taken as its name
        assert seg.name == engine.name


def test_notifications(engine, self_segment):
    engine.notify(self_segment, b"one")
    engine.notify(self_segment, "two")
    engine.notify(self_segment, bytearray(b"three"))
    big = bytes(range(256)) * 40  # 10240 bytes > the first receive buffer
    engine.notify(self_segment, big)
    assert engine.recv_notification(1) == (engine.name, b"one")
    assert engine.recv_notification(1).message == b"two"
    sender, msg = engine.recv_notification(1)
    assert msg == b"three"
    assert engine.recv_notification(1).message == big
    with pytest.raises(tent.Timeout):
        engine.recv_notification(0)
    with pytest.raises(TimeoutError):
        engine.recv_notification(0.05)
    with pytest.raises(tent.InvalidArgument):
        engine.notify(self_segment, b"x" * 65537)


def test_stats_counts_and_back_to_baseline(engine, self_segment):
    base = engine.stats()
    a = np.zeros(4096, np.uint8)
    r = engine.register(a)
    al = engine.alloc(8192)
    s = engine.stats()
    assert s["regions"] == base["regions"] + 2
    assert s["registered_bytes"] == base["registered_bytes"] + 4096 + 8192
    assert s["allocations"] == 1 and s["handles"] == base["handles"] + 2
    al.close()
    r.close()
    s = engine.stats()
    assert {k: s[k] for k in ("regions", "allocations", "handles")} == {
        k: base[k] for k in ("regions", "allocations", "handles")}


def test_transports_in_the_order_asked_for():
    with tent.Engine(transports="tcp,local") as e:
        assert e.transports == ["tcp", "local"]
        # the list is what tent_engine_options.transports takes back
        with tent.Engine(transports=",".join(e.transports)) as f:
            assert f.transports == e.transports


def test_uninstall(engine):
    with tent.Engine() as e:
        names = e.transports
        assert "tcp" in names
        e.uninstall("tcp")
        assert "tcp" not in e.transports
        with pytest.raises(tent.NotFound):
            e.uninstall("tcp")
        e.uninstall()
        assert e.transports == []


def test_engine_close_releases_children():
    e = tent.Engine()
    a = np.zeros(4096, np.uint8)
    r = e.register(a)
    al = e.alloc(4096)
    seg = e.open_segment(e.name)
    b = e.transfer([("write", r, seg, r.addr, 16)])
    b.wait()
    e.close()
    for obj in (r, al, seg, b):
        obj.close()  # no-op: the engine released them
        assert obj.closed
    with pytest.raises(tent.InvalidHandle):
        r.info()


def test_finalizers_release_everything(engine):
    a = np.zeros(4096, np.uint8)
    r = engine.register(a)
    al = engine.alloc(4096)
    seg = engine.open_segment(engine.name)
    b = engine.transfer([("write", r, seg, r.addr, 16)])
    b.wait()
    del r, al, seg, b
    gc.collect()
    assert leaks(engine) == {}


def test_region_stays_registered_while_busy(engine):
    # unregister while another thread's transfer pins the region: the
    # library waits (unregister timeout) and the region is never freed
    # under a transfer; here the transfer finishes quickly.
    src = np.ones(1 << 20, np.uint8)
    with engine.register(src) as r, engine.open_segment(engine.name) as seg:
        t = threading.Thread(target=lambda: engine.write(r, seg, r.addr))
        t.start()
        t.join()
    assert leaks(engine) == {}


def test_dlpack_numpy_registered_and_deleted(engine, self_segment):
    a = np.arange(256, dtype=np.uint8)

    class OnlyDLPack:
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kw):
            return self.arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    with engine.register(OnlyDLPack(a)) as r:
        assert r.addr == a.ctypes.data and r.size == 256
        dst = np.zeros(256, np.uint8)
        with engine.register(dst) as rd:
            engine.write(r, self_segment, rd.addr)
        assert np.array_equal(a, dst)


def test_notification_from_a_long_sender_name():
    name = "engine-with-a-long-name-" + "n" * 280  # longer than the first sender buffer
    with tent.Engine(name=name) as e, e.open_segment(e.name) as seg:
        assert e.name == name
        e.notify(seg, b"hi")
        assert e.recv_notification(1) == (name, b"hi")


def test_views_keep_the_engine_alive():
    import weakref

    e = tent.Engine()
    alive = weakref.ref(e)
    v = e.alloc(4096).view()
    del e
    gc.collect()
    assert alive() is not None  # the view holds the engine, so nothing was freed
    v[:2] = b"ok"
    assert bytes(v[:2]) == b"ok"
    v.release()
    del v
    gc.collect()
    assert alive() is None  # then it is collected (and its finalizer closed it)
