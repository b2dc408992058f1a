"""Bad input: each mistake raises one specific exception, and the engine
is unharmed afterwards (a transfer still works, nothing leaked)."""

import ctypes
import threading

import numpy as np
import pytest

import tent

from conftest import has_gpu, leaks, run_python


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
        ({"listen_addr": "not an address"}, tent.InvalidArgument),
        ({"listen_addr": "127.0.0.1:99999"}, tent.InvalidArgument),
        ({"listen_addr": "127.0.0.1:12ab"}, tent.InvalidArgument),
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


def test_remembered_transfer_options_keep_their_checks(setup):
    # Options of a (timeout, transport) pair are built once per engine and
    # reused: a value equal to a remembered one but of another type is
    # still checked, and a bad one is never remembered.
    engine, src, dst, rs, rd, seg = setup
    good = tent.make_requests("write", rs, seg, rd.addr, local_offsets=[0, 64], lengths=64)
    for _ in range(2):
        with engine.transfer(good, timeout=1, transport="local") as b:
            b.wait()
        engine.write(rs, seg, rd.addr, 64, timeout=1, transport="local")
    with pytest.raises(TypeError):
        engine.transfer(good, timeout=True, transport="local")  # True == 1, but not a number of seconds
    with pytest.raises(TypeError):
        engine.write(rs, seg, rd.addr, 64, timeout=True, transport="local")

    class Named(str):
        pass

    with pytest.raises(tent.InvalidArgument):
        engine.transfer(good, timeout=1, transport=Named("bogus"))
    for _ in range(2):
        with pytest.raises(tent.InvalidArgument):
            engine.transfer(good, timeout=-1, transport="local")
        with pytest.raises(tent.InvalidArgument):
            engine.transfer(good, timeout=1, transport="bogus")
        with pytest.raises(TypeError):
            engine.transfer(good, timeout=[1], transport="local")
    # many distinct pairs: each still right, the remembered ones bounded
    for ms in range(1, 3 * engine._MAX_OPTIONS):
        with engine.transfer(good, timeout=ms / 1000 + 1, transport="local") as b:
            b.wait()
    assert 0 < len(engine._options) <= engine._MAX_OPTIONS
    np.testing.assert_array_equal(dst[:128], src[:128])
    assert engine.stats()["batches"] == 0


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


# ---- values ctypes would convert silently (tent/_check.py) -------------------
#
# ctypes stores 2**64 + x as x and -1 as 2**64 - 1; numpy's int64 cast
# truncates 0.5 to 0. Each case names a request (a list entry for
# Engine.transfer) whose values are wrong in one way, and the exception it
# must raise; nothing may be submitted, and the destination stays untouched.

U64 = 1 << 64


def _requests_cases():
    # (id, build(rs, rd, seg) -> one request tuple, exception)
    return [
        ("remote 2**64 + addr", lambda rs, rd, seg: ("write", rs, seg, U64 + rd.addr, 16), tent.InvalidArgument),
        ("local 2**64 + addr", lambda rs, rd, seg: ("write", U64 + rs.addr, seg, rd.addr, 16), tent.InvalidArgument),
        ("remote -1", lambda rs, rd, seg: ("write", rs, seg, -1, 16), tent.InvalidArgument),
        ("local -1", lambda rs, rd, seg: ("write", -1, seg, rd.addr, 16), tent.InvalidArgument),
        ("length 2**64 + 16", lambda rs, rd, seg: ("write", rs, seg, rd.addr, U64 + 16), tent.InvalidArgument),
        ("length -16", lambda rs, rd, seg: ("write", rs, seg, rd.addr, -16), tent.InvalidArgument),
        ("length 0", lambda rs, rd, seg: ("write", rs, seg, rd.addr, 0), tent.InvalidArgument),
        ("remote range wraps", lambda rs, rd, seg: ("write", rs, seg, U64 - 8, 16), tent.InvalidArgument),
        ("local range wraps", lambda rs, rd, seg: ("write", U64 - 8, seg, rd.addr, 16), tent.InvalidArgument),
        ("length past the local Region", lambda rs, rd, seg: ("write", rs, seg, rd.addr, 4097), tent.InvalidArgument),
        ("segment 2**64 + handle", lambda rs, rd, seg: ("write", rs, U64 + seg.handle, rd.addr, 16),
         tent.InvalidArgument),
        ("length float", lambda rs, rd, seg: ("write", rs, seg, rd.addr, 16.0), TypeError),
        ("length bool", lambda rs, rd, seg: ("write", rs, seg, rd.addr, True), TypeError),
        ("remote float", lambda rs, rd, seg: ("write", rs, seg, float(rd.addr), 16), TypeError),
        ("remote str", lambda rs, rd, seg: ("write", rs, seg, str(rd.addr), 16), TypeError),
        ("local float", lambda rs, rd, seg: ("write", float(rs.addr), seg, rd.addr, 16), TypeError),
        ("segment float", lambda rs, rd, seg: ("write", rs, float(seg.handle), rd.addr, 16), TypeError),
        ("op bool", lambda rs, rd, seg: (True, rs, seg, rd.addr, 16), TypeError),
        ("op numpy bool", lambda rs, rd, seg: (np.True_, rs, seg, rd.addr, 16), TypeError),
    ]


@pytest.mark.parametrize("build, exc", [c[1:] for c in _requests_cases()], ids=[c[0] for c in _requests_cases()])
def test_transfer_tuple_values_are_checked(setup, build, exc):
    engine, src, dst, rs, rd, seg = setup
    req = build(rs, rd, seg)
    with pytest.raises(exc):
        engine.transfer([req]).wait()
    assert engine.stats()["batches"] == 0  # nothing was submitted
    assert not dst.any()  # and nothing written


def test_transfer_tuple_numpy_integers_are_integers(setup):
    engine, src, dst, rs, rd, seg = setup
    with engine.transfer([("write", np.uint64(rs.addr), seg, np.uint64(rd.addr), np.int32(16)),
                          (tent.WRITE, rs, seg.handle, np.int64(rd.addr + 16), np.uint16(16))]) as b:
        b.wait()
    assert np.array_equal(dst[:16], src[:16]) and np.array_equal(dst[16:32], src[:16]) and not dst[32:].any()


def _make_requests_cases():
    # (id, kwargs over a base of op "write", local rs, segment seg, remote rd.addr,
    #  local_offsets [0], lengths 16; values may be callables of (rs, rd)), exception)
    return [
        ("remote -1", {"remote": -1}, tent.InvalidArgument),
        ("remote 2**64", {"remote": U64}, tent.InvalidArgument),
        ("remote base + offset wraps", {"remote": U64 - 4096, "remote_offsets": lambda rs, rd: [4096 + rd.addr]},
         tent.InvalidArgument),
        ("remote offset + length wraps", {"remote": 0, "remote_offsets": [U64 - 1], "lengths": 2},
         tent.InvalidArgument),
        ("local int base 2**64 + addr", {"local": lambda rs, rd: U64 + rs.addr}, tent.InvalidArgument),
        ("local int base + length wraps", {"local": U64 - 8}, tent.InvalidArgument),
        ("local int base + offset wraps", {"local": lambda rs, rd: rs.addr,
                                          "local_offsets": lambda rs, rd: [U64 - rs.addr]},
         tent.InvalidArgument),
        # 2**63 + 2**63 is 0 in uint64: a naive end <= size check passes it
        ("offset + length wraps uint64", {"local_offsets": [1 << 63], "lengths": 1 << 63}, tent.InvalidArgument),
        ("offset past the Region", {"local_offsets": [4095], "lengths": 2}, tent.InvalidArgument),
        ("offset 2**64", {"local_offsets": [U64]}, tent.InvalidArgument),
        ("offset 2**70", {"local_offsets": [1 << 70]}, tent.InvalidArgument),
        ("negative remote offset", {"remote_offsets": [-1]}, tent.InvalidArgument),
        ("length 2**64", {"lengths": U64}, tent.InvalidArgument),
        ("length -1", {"lengths": [-1]}, tent.InvalidArgument),
        ("lengths of another shape", {"local_offsets": [0, 16, 32], "lengths": [16, 16]}, tent.InvalidArgument),
        ("offset 0.5", {"local_offsets": [0.5]}, TypeError),
        ("float32 offsets", {"local_offsets": np.zeros(1, np.float32)}, TypeError),
        ("remote offset 0.5", {"remote_offsets": [0.5]}, TypeError),
        ("length 16.0", {"lengths": 16.0}, TypeError),
        ("lengths [16.5]", {"lengths": [16.5]}, TypeError),
        ("bool lengths", {"lengths": [True]}, TypeError),
        ("str offsets", {"local_offsets": ["0"]}, TypeError),
        ("object offsets with a float", {"local_offsets": np.array([0, 0.5], dtype=object)}, TypeError),
        ("remote float", {"remote": lambda rs, rd: float(rd.addr)}, TypeError),
        ("remote bool", {"remote": True}, TypeError),
        ("segment handle 2**64", {"segment": U64}, tent.InvalidArgument),
        ("op bool", {"op": True}, TypeError),
        ("op numpy bool", {"op": np.True_}, TypeError),
    ]


def _make_requests_kwargs(rs, rd, seg, overrides):
    kw = {"op": "write", "local": rs, "segment": seg, "remote": rd.addr, "local_offsets": [0], "lengths": 16}
    for k, v in overrides.items():
        kw[k] = v(rs, rd) if callable(v) else v
    return kw


@pytest.mark.parametrize("overrides, exc", [c[1:] for c in _make_requests_cases()],
                         ids=[c[0] for c in _make_requests_cases()])
def test_make_requests_values_are_checked(setup, overrides, exc):
    engine, src, dst, rs, rd, seg = setup
    kw = _make_requests_kwargs(rs, rd, seg, overrides)
    with pytest.raises(exc) as info:
        tent.make_requests(kw.pop("op"), kw.pop("local"), kw.pop("segment"), kw.pop("remote"), **kw)
    if exc is not TypeError:
        assert isinstance(info.value, ValueError)  # never a bare OverflowError


def test_make_requests_accepts_numpy_integers_and_the_full_range(setup):
    engine, src, dst, rs, rd, seg = setup
    reqs = tent.make_requests("write", rs, seg, np.uint64(rd.addr), local_offsets=np.array([0, 64], np.uint64),
                              remote_offsets=np.array([64, 0], np.int16), lengths=np.int32(64))
    assert list(reqs["local_addr"]) == [rs.addr, rs.addr + 64]
    assert list(reqs["remote_addr"]) == [rd.addr + 64, rd.addr]
    with engine.transfer(reqs) as b:
        b.wait()
    assert np.array_equal(dst[64:128], src[:64]) and np.array_equal(dst[:64], src[64:128])
    # a range that ends exactly at 2**64 is representable (the library judges it)
    top = tent.make_requests("write", U64 - 16, seg, U64 - 32, local_offsets=[0], remote_offsets=[16], lengths=16)
    assert int(top["local_addr"][0]) == U64 - 16 and int(top["remote_addr"][0]) == U64 - 16
    # offsets beyond int64 but within uint64, as Python ints
    big = tent.make_requests("write", 0, seg, 0, local_offsets=[(1 << 63) + 5], lengths=1)
    assert int(big["local_addr"][0]) == (1 << 63) + 5


# ---- other parameters of the same kind ----------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"secret": 123}, TypeError),  # bytes(123) would be 123 NUL bytes
        ({"secret": [1, 2, 3]}, TypeError),
        ({"secret": 1.5}, TypeError),
        ({"secret": ""}, tent.InvalidArgument),
        ({"secret": bytearray()}, tent.InvalidArgument),
        ({"timeout": float("inf")}, tent.InvalidArgument),  # 0 would mean the 30 s default
        ({"timeout": True}, TypeError),
        ({"timeout": 10 ** 400}, tent.InvalidArgument),
        ({"unregister_timeout": -1}, tent.InvalidArgument),
        ({"unregister_timeout": float("nan")}, tent.InvalidArgument),
        ({"unregister_timeout": float("inf")}, tent.InvalidArgument),
        ({"unregister_timeout": "5"}, TypeError),
        ({"tcp_streams": 1.5}, TypeError),
        ({"tcp_streams": True}, TypeError),
        ({"tcp_streams": -1}, tent.InvalidArgument),
        ({"transports": 5}, TypeError),
        ({"transports": ["local", 3]}, TypeError),
        ({"metadata": "p2p\0x"}, tent.InvalidArgument),
        ({"listen_addr": "127.0.0.1:0\0"}, tent.InvalidArgument),
        ({"metadata_prefix": 7}, TypeError),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else v.__name__,
)
def test_engine_options_more(kwargs, exc):
    with pytest.raises(exc):
        tent.Engine(**kwargs)


def test_engine_options_of_other_valid_kinds():
    # numpy numbers, and every bytes-like secret meaning the same bytes
    with tent.Engine(secret=bytearray(b"s3cret"), tcp_streams=np.int64(2), timeout=np.float64(5),
                     transports=("local", "tcp")) as a:
        assert a.transports == ["local", "tcp"]
        for secret in ("s3cret", b"s3cret", memoryview(b"s3cret"), np.frombuffer(b"s3cret", np.uint8)):
            with tent.Engine(secret=secret) as b, b.open_segment(a.name):
                pass
        with tent.Engine(secret=memoryview(b"s3creT")) as c:
            with pytest.raises(tent.AuthError):
                c.open_segment(a.name)


def test_memory_arguments_are_checked(setup):
    engine, src, dst, rs, rd, seg = setup
    buf = (ctypes.c_char * 64)()
    addr = ctypes.addressof(buf)
    for obj, exc in [((addr, 64.0), TypeError), ((float(addr), 64), TypeError), ((addr, True), TypeError),
                     ((U64 + addr, 64), tent.InvalidArgument), ((addr, U64), tent.InvalidArgument),
                     (_ArrayInterface(U64 + addr, (64,)), tent.InvalidArgument),
                     (_ArrayInterface(-addr, (64,)), tent.InvalidArgument),
                     (_ArrayInterface(float(addr), (64,)), TypeError),
                     (_ArrayInterface(addr, (64.5,)), TypeError)]:
        with pytest.raises(exc):
            engine.register(obj)
    with engine.register((np.uint64(addr), np.int32(64))) as r:  # numpy integers are integers
        assert (r.addr, r.size) == (addr, 64)
    with engine.register(_ArrayInterface(addr, (64,))) as r:
        assert (r.addr, r.size) == (addr, 64)
    for flags in ({"remote_write": "no"}, {"remote_read": 0}, {"remote_write": None}):
        with pytest.raises(TypeError):  # "no" is truthy: it must not grant remote writes
            engine.register(np.zeros(64, np.uint8), **flags)
        with pytest.raises(TypeError):
            engine.alloc(4096, **flags)
    with engine.register(np.zeros(64, np.uint8), remote_write=np.bool_(False)) as r:
        assert not r.info().remote_write
    assert leaks_besides_setup(engine) == 0
    for size, exc in ((True, TypeError), (np.float64(4096), TypeError)):
        with pytest.raises(exc):
            engine.alloc(size)
    with engine.alloc(np.int64(4096)) as a:
        assert a.size == 4096


class _ArrayInterface:
    """An object exposing only __array_interface__ (plain data, so it can
    claim any address)."""

    def __init__(self, addr, shape):
        self.__array_interface__ = {"data": (addr, False), "shape": shape, "typestr": "|u1", "version": 3}


def leaks_besides_setup(engine):
    return engine.stats()["regions"] - 2  # the fixture's two regions


def test_sync_transfer_values_are_checked(setup):
    engine, src, dst, rs, rd, seg = setup
    for call, exc in [
        (lambda: engine.write(rs, seg, U64 - 8, 16), tent.InvalidArgument),  # remote range wraps
        (lambda: engine.write(rs, seg, U64 + rd.addr), tent.InvalidArgument),
        (lambda: engine.write(rs, seg, float(rd.addr)), TypeError),
        (lambda: engine.write(rs, seg, rd.addr, True), TypeError),
        (lambda: engine.write((rs, 1.5), seg, rd.addr), TypeError),
        (lambda: engine.write((rs, -1), seg, rd.addr), tent.InvalidArgument),
        (lambda: engine.write((rs, U64), seg, rd.addr), tent.InvalidArgument),
    ]:
        with pytest.raises(exc):
            call()
    assert not dst.any()
    engine.write((rs, np.int64(16)), seg, np.uint64(rd.addr + 16), np.int32(16))
    assert np.array_equal(dst[16:32], src[16:32]) and not dst[:16].any()


def test_notify_and_timeout_values_are_checked(setup):
    engine, src, dst, rs, rd, seg = setup
    req = [("write", rs, seg, rd.addr, 16)]
    for kwargs, exc in [({"notify": 5}, TypeError),  # bytes(5) would be 5 NUL bytes
                        ({"notify": [1, 2]}, TypeError),
                        ({"notify": 1.5}, TypeError),
                        ({"notify": b"x" * 65537}, tent.InvalidArgument),
                        ({"timeout": float("inf")}, tent.InvalidArgument),
                        ({"timeout": float("nan")}, tent.InvalidArgument),
                        ({"timeout": "1"}, TypeError),
                        ({"transport": "shm\0"}, tent.InvalidArgument)]:
        with pytest.raises(exc):
            engine.transfer(req, **kwargs)
    assert engine.stats()["batches"] == 0
    for message, exc in [(5, TypeError), (1.5, TypeError), (b"x" * 65537, tent.InvalidArgument)]:
        with pytest.raises(exc):
            engine.notify(seg, message)
    for timeout, exc in [(float("inf"), tent.InvalidArgument), (-1, tent.InvalidArgument),
                         (float("nan"), tent.InvalidArgument), ("0", TypeError)]:
        with pytest.raises(exc):
            engine.recv_notification(timeout)
    with engine.transfer(req, notify=bytearray(b"done")) as b:
        for timeout, exc in [(float("nan"), tent.InvalidArgument), (-1, tent.InvalidArgument), ("1", TypeError)]:
            with pytest.raises(exc):
                b.wait(timeout)
        b.wait(float("inf"))  # until the batch ends
    assert engine.recv_notification(5) == (engine.name, b"done")


def test_out_of_range_is_a_value_error(setup):
    engine, src, dst, rs, rd, seg = setup
    with pytest.raises(ValueError) as info:
        engine.write(rs, seg, rd.addr + 1)  # runs past the remote region
    assert isinstance(info.value, tent.OutOfRange) and isinstance(info.value, IndexError)


def test_unmapped_registered_memory_fails_the_request_not_the_process():
    # In a child process, so that a crash is a failed test, not a dead suite.
    code = """
import ctypes, mmap, numpy as np, tent
libc = ctypes.CDLL(None)
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mmap.restype = ctypes.c_void_p
with tent.Engine() as e:
    addr = libc.mmap(None, 1 << 16, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    gone = e.register((addr, 1 << 16))
    ok = np.zeros(1 << 16, np.uint8)
    rok = e.register(ok)
    seg = e.open_segment(e.name)
    assert libc.munmap(addr, 1 << 16) == 0
    for name, call in (("source", lambda: e.write(gone, seg, rok.addr)), ("target", lambda: e.write(rok, seg, addr))):
        try:
            call()
        except tent.InvalidArgument as exc:
            assert "not mapped" in str(exc), exc
            print(name, "failed cleanly")
        else:
            raise AssertionError(name + ": the transfer succeeded")
    e.write(rok, seg, rok.addr)  # the engine still works
    assert e.stats()["batches"] == 0
    seg.close(); rok.close(); gone.close()
"""
    p = run_python(code)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split("\n")[:2] == ["source failed cleanly", "target failed cleanly"]


@pytest.mark.parametrize(
    "args, kwargs, exc",
    [
        ((tent.WRITE, 0, 0x1000, 1, U64, 16), {}, tent.InvalidArgument),  # would be remote_addr 0
        ((tent.WRITE, 0, U64 + 0x1000, 1, 0x2000, 16), {}, tent.InvalidArgument),
        ((tent.WRITE, 0, 0x1000, 1, 0x2000, -1), {}, tent.InvalidArgument),
        ((1 << 32,), {}, tent.InvalidArgument),
        ((tent.WRITE, 0, 0x1000, 1, 8192.0, 16), {}, TypeError),
        ((), {"length": 16.0}, TypeError),
        ((), {"remote_addr": "0x1000"}, TypeError),
        ((), {"no_such_field": 1}, TypeError),
        ((1, 0, 1, 1, 1, 1, 1), {}, TypeError),
    ],
    ids=["remote 2**64", "local 2**64 + x", "length -1", "opcode 2**32", "remote float", "length float",
         "remote str", "unknown field", "too many values"],
)
def test_request_struct_constructor_checks_values(args, kwargs, exc):
    with pytest.raises(exc):
        tent.Request(*args, **kwargs)


def test_request_struct_constructor_takes_integers_of_any_kind():
    r = tent.Request(np.uint32(tent.WRITE), 0, np.uint64(U64 - 1), None, U64 - 1, length=np.int64(16))
    assert (r.opcode, r.local_addr, r.segment, r.remote_addr, r.length) == (tent.WRITE, U64 - 1, None, U64 - 1, 16)


def _object_memory():
    """Memory that holds PyObject pointers, in each form resolve() accepts."""
    class Interface:
        def __init__(self, arr, descr=None):
            self._arr = arr  # keeps the memory alive
            self.__array_interface__ = {"data": (arr.ctypes.data, False), "shape": arr.shape,
                                        "typestr": arr.dtype.str, "version": 3}
            if descr is not None:
                self.__array_interface__["descr"] = descr

    objs = np.array([object(), "text", None], dtype=object)
    mixed = np.zeros(3, dtype=[("Other", "u1"), ("obj", "O")])  # "O" in a field name is no object
    return [
        objs,
        mixed,
        (ctypes.py_object * 3)(),
        Interface(objs),
        Interface(np.zeros(24, np.uint8), descr=[("a", "|u1"), ("b", [("c", "|O")])]),
    ]


def test_memory_holding_python_objects_is_refused(setup):
    """A transfer into an object array overwrote PyObject pointers (the
    process crashed when the array was next used), and a peer granted the
    region could read heap addresses or plant pointers."""
    engine, src, dst, rs, rd, seg = setup
    for obj in _object_memory():
        for kwargs in ({}, {"remote_write": False}):
            with pytest.raises(tent.InvalidArgument, match="object references"):
                engine.register(obj, **kwargs)
        with pytest.raises(tent.InvalidArgument, match="object references"):
            engine.register_batch([np.zeros(64, np.uint8), obj])
        with pytest.raises(tent.InvalidArgument, match="object references"):
            engine.read(obj, seg, rs.addr, 8)
        with pytest.raises(tent.InvalidArgument, match="object references"):
            engine.write(obj, seg, rd.addr, 8)
        with pytest.raises(tent.InvalidArgument, match="object references"):
            engine.notify(seg, obj)
        if not hasattr(obj, "__array_interface__") or isinstance(obj, np.ndarray):  # blobs are bytes-like
            with pytest.raises(tent.InvalidArgument, match="object references"):
                engine.transfer([("write", rs, seg, rd.addr, 8)], notify=obj)
            with pytest.raises(tent.InvalidArgument, match="object references"):
                tent.Engine(secret=obj)
    assert leaks_besides_setup(engine) == 0
    # A field name with an "O" is not an object, nor is a numeric array.
    named = np.zeros(4, dtype=[("Other", "u1"), ("ONE", "<u4")])
    with engine.register(named) as r:
        assert r.size == named.nbytes


def test_unregister_batch_with_a_region_twice_is_an_error_not_a_hang(setup):
    """The region's lock was taken once per entry: a region listed twice
    deadlocked the calling thread."""
    engine, src, dst, rs, rd, seg = setup
    a, b = engine.register(np.zeros(64, np.uint8)), engine.register(np.zeros(64, np.uint8))
    result = []
    t = threading.Thread(target=lambda: result.append(_raises(lambda: engine.unregister_batch([a, b, a]))))
    t.daemon = True  # a hang must fail the test, not the interpreter's exit
    t.start()
    t.join(30)
    assert not t.is_alive(), "unregister_batch([a, b, a]) hung"
    assert isinstance(result[0], tent.InvalidArgument) and "same region" in str(result[0])
    assert not a.closed and not b.closed  # all or none: nothing was unregistered
    assert leaks_besides_setup(engine) == 2
    with pytest.raises(TypeError):
        engine.unregister_batch([a, 12345])
    engine.unregister_batch([b, a])
    assert a.closed and leaks_besides_setup(engine) == 0


class _RecordingLock:
    """A lock that records, in a shared list, the order it is taken in."""

    def __init__(self, name, order):
        self._lock, self._name, self._order = threading.Lock(), name, order

    def acquire(self, *args):
        self._order.append(self._name)
        return self._lock.acquire(*args)

    def release(self):
        self._lock.release()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def test_unregister_batch_takes_region_locks_in_one_order(setup):
    """Two batches of the same regions listed in different orders, on two
    threads, each held one lock and waited for the other's: a deadlock. Both
    must take the locks in the same order, whatever the list's."""
    engine, src, dst, rs, rd, seg = setup
    orders = []
    for listed in ("xy", "yx"):
        x, y = engine.register(np.zeros(64, np.uint8)), engine.register(np.zeros(64, np.uint8))
        order = []
        x._lock, y._lock = _RecordingLock(id(x) < id(y), order), _RecordingLock(id(y) < id(x), order)
        engine.unregister_batch([x, y] if listed == "xy" else [y, x])
        assert x.closed and y.closed
        orders.append(order[:2])
    assert orders[0] == orders[1]


def _raises(f):
    try:
        f()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def test_array_interface_item_size_must_be_positive(setup):
    """typestr "<u-5" gave a negative length, which reached the library as
    2**64 - 40 (ctypes wraps it) instead of failing here."""
    engine, src, dst, rs, rd, seg = setup
    buf = (ctypes.c_char * 64)()
    for typestr in ("<u-5", "|V-8", "<u", "<uX", "|u0"):
        obj = _ArrayInterface(ctypes.addressof(buf), (8,))
        obj.__array_interface__["typestr"] = typestr
        for use in (engine.register, lambda o: engine.write(o, seg, rd.addr), lambda o: engine.notify(seg, o)):
            with pytest.raises(tent.InvalidArgument, match="typestr"):
                use(obj)
    assert leaks_besides_setup(engine) == 0


def test_arrays_without_a_buffer_export_use_their_array_interface(setup):
    """numpy exports no buffer for datetime64 arrays: memoryview() raised a
    bare ValueError, though the array is plain contiguous memory."""
    engine, src, dst, rs, rd, seg = setup
    times = np.arange(8).astype("datetime64[ns]")
    with engine.register(times) as r:
        assert (r.addr, r.size) == (times.ctypes.data, times.nbytes)
        engine.write(r, seg, rd.addr)
    assert bytes(dst[: times.nbytes]) == times.tobytes()
    with pytest.raises(tent.InvalidArgument, match="not contiguous"):
        engine.register(times[::2])
