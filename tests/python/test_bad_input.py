"""Bad input: each mistake raises one specific exception, and the engine
is unharmed afterwards (a transfer still works, nothing leaked)."""

import numpy as np
import pytest

import tent

from conftest import has_gpu, leaks


@pytest.fixture
def setup(engine):
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros(4096, np.uint8)
    rs, rd = engine.register(src), engine.register(dst)
    seg = engine.open_segment(engine.name)
    yield engine, src, dst, rs, rd, seg
    # unharmed: a transfer still works, then everything is released
    dst[:] = 0
    if not seg.closed:
        engine.write(rs, seg, rd.addr)
        assert np.array_equal(src, dst)
    seg.close()
    rs.close()
    rd.close()
    assert leaks(engine) == {}


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"name": 123}, TypeError),
        ({"name": "a\0b"}, tent.InvalidArgument),
        ({"name": ""}, tent.InvalidArgument),
        ({"timeout": -1}, tent.InvalidArgument),
        ({"timeout": float("nan")}, tent.InvalidArgument),
        ({"timeout": "1"}, TypeError),
        ({"timeout": 1e300}, tent.InvalidArgument),
        ({"transports": "nope"}, tent.NotFound),
        ({"transports": ""}, tent.InvalidArgument),
        ({"transports": "local,,tcp"}, tent.InvalidArgument),
        ({"metadata": "bogus://x"}, tent.InvalidArgument),
        ({"tcp_streams": 0}, tent.InvalidArgument),
        ({"tcp_streams": 1 << 40}, tent.InvalidArgument),
        ({"tcp_streams": 100000}, tent.InvalidArgument),
        ({"secret": b""}, tent.InvalidArgument),
        ({"secret": b"x" * 5000}, tent.InvalidArgument),
        ({"listen_addr": "not an address"}, tent.TransportError),
    ],
)
def test_engine_options(kwargs, exc):
    with pytest.raises(exc):
        tent.Engine(**kwargs)


def test_register_bad_memory(setup):
    engine, src, dst, rs, rd, seg = setup
    with pytest.raises(TypeError):
        engine.register(123)
    with pytest.raises(TypeError):
        engine.register("text")
    with pytest.raises(tent.InvalidArgument):
        engine.register(bytearray())
    with pytest.raises(tent.InvalidArgument):
        engine.register(np.zeros((8, 8))[:, ::2])
    with pytest.raises(tent.InvalidArgument):
        engine.register((0, 10))
    with pytest.raises(tent.InvalidArgument):
        engine.register((0x1000, -5))
    with pytest.raises(tent.InvalidArgument):
        engine.register(((1 << 64) - 4096, 1 << 20))
    with pytest.raises(tent.InvalidArgument):
        engine.register(np.zeros(64), location="bogus")
    with pytest.raises(tent.AlreadyRegistered):
        engine.register(src)
    with pytest.raises(tent.Overlap):
        engine.register(src[100:200])
    with pytest.raises(ValueError):  # the builtin base of both
        engine.register(dst[1:])


def test_readonly_memory(setup):
    engine, src, dst, rs, rd, seg = setup
    data = b"read-only data" * 100
    with pytest.raises(tent.InvalidArgument):
        engine.register(data)  # remote_write=True by default
    with engine.register(data, remote_write=False) as r:
        assert r.readonly and not r.info().remote_write
        engine.write(r, seg, rd.addr)  # a source is fine
        assert bytes(dst[: len(data)]) == data
        with pytest.raises(tent.InvalidArgument):
            engine.read(r, seg, rs.addr)  # a destination is not
        with pytest.raises(tent.InvalidArgument):
            tent.make_requests("read", r, seg, rs.addr, local_offsets=[0], lengths=16)
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(tent.InvalidArgument):
        engine.read(ro, seg, rs.addr)


def test_alloc_bad_sizes(setup):
    engine = setup[0]
    for size, exc in ((0, tent.InvalidArgument), (-1, tent.InvalidArgument), (1 << 64, tent.InvalidArgument),
                      ("4096", TypeError), (4096.0, TypeError)):
        with pytest.raises(exc):
            engine.alloc(size)
    with pytest.raises(tent.InvalidArgument):
        engine.alloc(4096, location="bogus")
    with pytest.raises((tent.NoMemory, tent.InvalidArgument)):
        engine.alloc(1 << 62)
    if not has_gpu():
        with pytest.raises(tent.Unsupported):
            engine.alloc(4096, location="cuda:0")


def test_sync_transfer_bad_arguments(setup):
    engine, src, dst, rs, rd, seg = setup
    with pytest.raises(TypeError):
        engine.write(rs, "segment", rd.addr)
    with pytest.raises(tent.InvalidArgument):
        engine.write(rs, seg, rd.addr, 0)
    with pytest.raises(tent.InvalidArgument):
        engine.write(rs, seg, rd.addr, 4097)
    with pytest.raises(tent.InvalidArgument):
        engine.write(rs, seg, rd.addr, -1)
    with pytest.raises(TypeError):
        engine.write(rs, seg, rd.addr, 1.5)
    with pytest.raises(tent.InvalidArgument):
        engine.write(rs, seg, -1)
    with pytest.raises(tent.InvalidArgument):
        engine.write(rs, seg, 1 << 64)
    with pytest.raises(TypeError):
        engine.write(rs, seg, "0x1000")
    with pytest.raises(tent.InvalidArgument):
        engine.write((rs, 4096), seg, rd.addr)
    with pytest.raises(tent.NotRegistered):  # local memory not registered
        engine.write(np.zeros(64, np.uint8), seg, rd.addr)
    with pytest.raises((tent.NotRegistered, tent.OutOfRange)):  # remote address not registered
        engine.write(rs, seg, 0x1000)
    with pytest.raises(tent.OutOfRange):  # runs past the remote region
        engine.write(rs, seg, rd.addr + 1)
    with pytest.raises(tent.InvalidArgument):
        engine.write(rs, seg, rd.addr, transport="carrier-pigeon")
    with pytest.raises(tent.InvalidArgument):
        engine.write(rs, seg, rd.addr, timeout=-2)


def test_batch_bad_arguments(setup):
    engine, src, dst, rs, rd, seg = setup
    good = tent.make_requests("write", rs, seg, rd.addr, local_offsets=[0, 64], lengths=64)
    with pytest.raises(tent.InvalidArgument):
        engine.transfer([])
    with pytest.raises(tent.InvalidArgument):
        engine.transfer(good[:0])
    with pytest.raises(TypeError):
        engine.transfer(np.zeros(2, dtype=np.uint64))
    with pytest.raises(TypeError):
        engine.transfer("requests")
    with pytest.raises(tent.InvalidArgument):
        engine.transfer(np.stack([good, good]))
    with pytest.raises(tent.InvalidArgument):
        engine.transfer(np.concatenate([good, good])[::2])
    for field, index, value, error in [
        ("opcode", 1, 7, tent.InvalidArgument),
        ("reserved", 0, 1, tent.InvalidArgument),
        ("segment", 1, 0xDEAD, tent.InvalidHandle),
        ("length", 0, 0, tent.InvalidArgument),
        ("local_addr", 0, 0x1000, tent.NotRegistered),
    ]:
        bad = good.copy()
        bad[field][index] = value
        with pytest.raises(error):
            engine.transfer(bad)
    with pytest.raises(tent.InvalidArgument):
        engine.transfer(good, notify=b"x" * 70000)
    with pytest.raises(tent.InvalidArgument):
        engine.transfer(good, transport="bogus")
    with pytest.raises(TypeError):
        engine.transfer([("write", rs, seg)])
    with pytest.raises(tent.InvalidArgument):
        engine.transfer([("sideways", rs, seg, rd.addr, 4)])
    assert engine.stats()["batches"] == 0  # nothing was submitted


def test_make_requests_bad_arguments(setup):
    engine, src, dst, rs, rd, seg = setup
    kw = dict(local_offsets=[0, 64], lengths=64)
    with pytest.raises(tent.InvalidArgument):
        tent.make_requests("write", rs, seg, rd.addr, local_offsets=[-1], lengths=4)
    with pytest.raises(tent.InvalidArgument):
        tent.make_requests("write", rs, seg, rd.addr, local_offsets=[0], lengths=0)
    with pytest.raises(tent.InvalidArgument):
        tent.make_requests("write", rs, seg, rd.addr, local_offsets=[4090], lengths=64)  # past the region
    with pytest.raises(tent.InvalidArgument):
        tent.make_requests("write", rs, seg, rd.addr, local_offsets=[0, 1], remote_offsets=[0], lengths=4)
    with pytest.raises(tent.InvalidArgument):
        tent.make_requests("write", rs, seg, rd.addr, local_offsets=[], lengths=4)
    with pytest.raises(tent.InvalidArgument):
        tent.make_requests("write", rs, seg, rd.addr, local_offsets=[1 << 70], lengths=4)
    with pytest.raises(tent.InvalidArgument):
        tent.make_requests("copy", rs, seg, rd.addr, **kw)
    with pytest.raises(TypeError):
        tent.make_requests("write", "region", seg, rd.addr, **kw)
    with pytest.raises(TypeError):
        tent.make_requests("write", rs, "segment", rd.addr, **kw)


def test_stale_objects_and_double_close(setup):
    engine, src, dst, rs, rd, seg = setup
    r = engine.register(np.zeros(64, np.uint8))
    r.close()
    r.close()  # idempotent
    with pytest.raises(tent.InvalidHandle):
        r.info()
    with pytest.raises(tent.InvalidHandle):
        engine.write(r, seg, rd.addr)
    with pytest.raises(tent.InvalidHandle):
        tent.make_requests("write", r, seg, rd.addr, local_offsets=[0], lengths=4)
    s = engine.open_segment(engine.name)
    stale_handle = s.handle
    s.close()
    s.close()
    with pytest.raises(tent.InvalidHandle):
        engine.write(rs, s, rd.addr)
    with pytest.raises(tent.InvalidHandle):
        engine.notify(s, b"x")
    b = engine.transfer([("write", rs, seg, rd.addr, 16)])
    b.close()
    b.close()
    for call in (b.wait, b.status, lambda: b.done, lambda: b.completed):
        with pytest.raises(tent.InvalidHandle):
            call()
    a = engine.alloc(4096)
    a.close()
    a.close()
    with pytest.raises(tent.InvalidHandle):
        a.view()
    # a handle value that was closed, used by hand
    stale = tent.make_requests("write", rs, seg, rd.addr, local_offsets=[0], lengths=4)
    stale["segment"] = stale_handle
    with pytest.raises(tent.InvalidHandle):
        engine.transfer(stale)


def test_objects_of_another_engine(setup):
    engine, src, dst, rs, rd, seg = setup
    with tent.Engine() as other:
        oseg = other.open_segment(engine.name)
        with pytest.raises(tent.InvalidHandle):
            engine.write(rs, oseg, rd.addr)
        with pytest.raises(tent.InvalidHandle):
            engine.unregister_batch([other.register(np.zeros(8, np.uint8))])


def test_closed_engine(setup):
    e = tent.Engine()
    e.close()
    a = np.zeros(64, np.uint8)
    for call in (lambda: e.register(a), lambda: e.alloc(64), lambda: e.open_segment("x"), e.stats,
                 lambda: e.name, lambda: e.recv_notification(0), e.uninstall,
                 lambda: e.transfer([("write", 1, 1, 1, 1)])):
        with pytest.raises(tent.InvalidHandle):
            call()
    e.close()


def test_unknown_segment(setup):
    engine = setup[0]
    with pytest.raises(TypeError):
        engine.open_segment(123)
    with pytest.raises(tent.InvalidArgument):
        engine.open_segment("")
    with pytest.raises((tent.TransportError, tent.NotFound, tent.Timeout)):
        engine.open_segment("127.0.0.1:1")
