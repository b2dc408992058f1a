"""The batch calls of the Mooncake and NIXL APIs hand tent their
addresses as three columns (tent_transfer_columns): each call moves
exactly the bytes it names, whatever form the client's lists take, and
refuses bad input as before -- Mooncake with the bindings' TypeError or
a -1 and tent's message, NIXL with its exception classes -- with nothing
moved and nothing left behind."""

import numpy as np
import pytest

from conftest import leaks

N, SLOT = 40, 256  # requests per batch, bytes between their starts


def _pattern(n, seed):
    return (np.arange(n, dtype=np.uint64) * 2654435761 + seed).astype(np.uint8)


def _plan(src, dst, n=N):
    """n requests of 1..SLOT bytes: the i-th from src + i*SLOT to
    dst + (n-1-i)*SLOT (reversed, so a request moved to the wrong place
    is seen), lengths all different."""
    lens = [1 + (i * 37) % SLOT for i in range(n)]
    return ([src + i * SLOT for i in range(n)], [dst + (n - 1 - i) * SLOT for i in range(n)], lens)


def _expected(mem, src_off, dst_off, n=N):
    """mem after the plan from src_off to dst_off, on a zeroed destination."""
    want = mem.copy()
    want[dst_off:dst_off + n * SLOT] = 0
    for i in range(n):
        k = 1 + (i * 37) % SLOT
        d = dst_off + (n - 1 - i) * SLOT
        want[d:d + k] = mem[src_off + i * SLOT:src_off + i * SLOT + k]
    return want


# ---- Mooncake ------------------------------------------------------------------------


@pytest.fixture(params=["tcp", "rdma"])  # tcp: tcp only; rdma: tent's best (local, in one process)
def mooncake(request):
    from mooncake.engine import TransferEngine

    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", request.param, "") == 0
    mem = np.zeros(1 << 16, dtype=np.uint8)
    mem[:1 << 15] = _pattern(1 << 15, 3)
    assert e.register_memory(mem.ctypes.data, mem.nbytes) == 0
    yield e, f"127.0.0.1:{e.get_rpc_port()}", mem
    assert e.unregister_memory(mem.ctypes.data) == 0
    held = leaks(e.get_engine())
    assert held.pop("segments", 1) == 1 and held.pop("handles", 1) == 1  # its own segment, open until close()
    assert held == {}
    e.close()


LIST_FORMS = {
    "list": lambda v: v,
    "tuple": tuple,
    "uint64 array": lambda v: np.array(v, dtype=np.uint64),
    "int64 array": lambda v: np.array(v, dtype=np.int64),
    "numpy integers": lambda v: [np.uint64(x) for x in v],
}


@pytest.mark.parametrize("form", sorted(LIST_FORMS))
def test_mooncake_batches_move_the_bytes_they_name(mooncake, form):
    e, target, mem = mooncake
    base, half = mem.ctypes.data, 1 << 15
    f = LIST_FORMS[form]
    src, dst, lens = _plan(base, base + half)
    want = _expected(mem, 0, half)
    assert e.batch_transfer_sync_write(target, f(src), f(dst), f(lens)) == 0, e.last_error
    assert np.array_equal(mem, want)

    # read back, into the other half (the source), after zeroing it
    mem[:half] = 0
    assert e.batch_transfer_sync_read(target, f(src), f(dst), f(lens)) == 0, e.last_error
    for i in range(N):
        k = lens[i]
        assert np.array_equal(mem[i * SLOT:i * SLOT + k], want[half + (N - 1 - i) * SLOT:][:k]), i

    # the async calls, and a batch of one
    mem[half:] = 0
    ids = [e.batch_transfer_async_write(target, f(src[:20]), f(dst[:20]), f(lens[:20])),
           e.batch_transfer_async(target, f(src[20:]), f(dst[20:]), f(lens[20:]), e.TransferOpcode.Write)]
    assert all(ids) and e.get_batch_transfer_status(ids) == 0, e.last_error
    assert e.transfer_sync_write(target, src[0], dst[0], lens[0]) == 0
    np.testing.assert_array_equal(mem[half:], want[half:])


def test_mooncake_notify_arrives_after_the_data(mooncake):
    from mooncake.engine import TransferNotify

    e, target, mem = mooncake
    base, half = mem.ctypes.data, 1 << 15
    src, dst, lens = _plan(base, base + half)
    assert e.batch_transfer_sync(target, src, dst, lens, e.TransferOpcode.Write, TransferNotify("n", "batch")) == 0
    assert np.array_equal(mem, _expected(mem, 0, half))
    assert e.transfer_sync(target, base, base + half, 64, e.TransferOpcode.Read, TransferNotify("n", "one")) == 0
    got = []
    for _ in range(200):
        got += [(x.name, x.msg) for x in e.get_notifies()]
        if len(got) == 2:
            break
        import time

        time.sleep(0.01)
    assert got == [("n", "batch"), ("n", "one")]


def _bad_mooncake_calls(base, half, elsewhere):
    src, dst, lens = _plan(base, base + half, 4)
    # (what, buffers, peer addresses, lengths, the code, a part of last_error; code None: the TypeError)
    return [
        ("a float address", [float(src[0])] + src[1:], dst, lens, None, ""),
        ("a negative length", src, dst, lens[:3] + [-1], None, ""),
        ("None as an address", src, [None] + dst[1:], lens, None, ""),
        ("an address of 2**64", src, dst[:3] + [1 << 64], lens, None, ""),
        ("a str as a list", "abcd", dst, lens, None, ""),
        ("a float array", np.array(src, dtype=np.float64), dst, lens, None, ""),
        ("lists of different lengths", src, dst[:3], lens, -1, "the lists must have one entry each"),
        ("a zero length", src, dst, lens[:2] + [0] + lens[3:], -1, "transfer 2: length 0"),
        ("a zero length, array", src, dst, np.array(lens[:2] + [0] + lens[3:], dtype=np.uint64), -1,
         "transfer 2: length 0"),
        ("a range past 2**64", src, dst[:3] + [(1 << 64) - 8], lens, -1, "past 2**64"),
        ("local memory not registered", [elsewhere] + src[1:], dst, lens, -1, "request 0"),
        ("a remote range past its registration", src, dst[:1] + [base + (1 << 16) - 8] + dst[2:], lens, -1,
         "request 1: remote"),
        ("a remote range outside every registration", src, dst[:1] + [elsewhere] + dst[2:], lens, -1,
         "not registered"),
    ]


@pytest.mark.parametrize("call", ["sync_write", "sync_read", "sync", "async_write", "async"])
def test_mooncake_bad_batches_refused_as_before(mooncake, call):
    e, target, mem = mooncake
    base, half = mem.ctypes.data, 1 << 15
    other = np.zeros(4096, dtype=np.uint8)
    W = e.TransferOpcode.Write
    calls = {
        "sync_write": lambda b, p, n: e.batch_transfer_sync_write(target, b, p, n),
        "sync_read": lambda b, p, n: e.batch_transfer_sync_read(target, b, p, n),
        "sync": lambda b, p, n: e.batch_transfer_sync(target, b, p, n, W),
        "async_write": lambda b, p, n: e.batch_transfer_async_write(target, b, p, n),
        "async": lambda b, p, n: e.batch_transfer_async(target, b, p, n, W),
    }
    run = calls[call]
    failed = 0 if call.startswith("async") else -1
    for what, b, p, n, code, msg in _bad_mooncake_calls(base, half, other.ctypes.data):
        before = mem.copy()
        e.last_error = ""
        if code is None:
            with pytest.raises(TypeError, match="incompatible function arguments"):
                run(b, p, n)
            assert e.last_error == "", what
        else:
            rc = run(b, p, n)
            if call.startswith("async") and rc != 0:
                # refused by the target: the batch was made, its status fails
                assert "remote range" in what, what
                rc = e.get_batch_transfer_status([rc])
                assert rc == -1, what
            else:
                assert rc == failed, (what, rc)
            assert msg in e.last_error, (what, e.last_error)
        if "remote range" not in what:  # (a request the target refuses fails alone: the others move)
            assert np.array_equal(mem, before), f"{what}: data moved"
        held = leaks(e.get_engine())
        assert held.get("batches", 0) == held.get("requests_in_flight", 0) == 0, (what, held)
    # an empty batch: nothing to do for the sync calls (0); the async ones
    # give a batch id that is complete, as Mooncake's (a batch without tasks is COMPLETED)
    e.last_error = ""
    if call.startswith("async"):
        bid = run([], [], [])
        assert bid > 0 and e.get_batch_transfer_status([bid]) == 0
        assert run([], [], []) > 0 and e.get_batch_transfer_status([bid + 1]) == 0
    else:
        assert run([], [], []) == 0
    assert e.last_error == ""


# ---- NIXL ----------------------------------------------------------------------------


@pytest.fixture
def agents():
    from nixl._api import nixl_agent, nixl_agent_config

    a = nixl_agent("A", nixl_agent_config(backends=["UCX"], capture_telemetry=True))
    b = nixl_agent("B", nixl_agent_config(backends=["UCX"]))
    mem_a = _pattern(N * SLOT, 5)
    mem_b = np.zeros(N * SLOT, dtype=np.uint8)
    ra = a.register_memory([(mem_a.ctypes.data, mem_a.nbytes, 0, "")], "DRAM")
    rb = b.register_memory([(mem_b.ctypes.data, mem_b.nbytes, 0, "")], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())
    lens = [1 + (i * 37) % SLOT for i in range(N)]
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(mem_a.ctypes.data + i * SLOT, lens[i], 0) for i in range(N)],
                              "DRAM")
    # B's descriptor j has the length of A's descriptor N-1-j
    remote = a.prep_xfer_dlist("B", [(mem_b.ctypes.data + j * SLOT, lens[N - 1 - j], 0) for j in range(N)], "DRAM")
    yield a, b, mem_a, mem_b, local, remote, lens
    a.release_dlist_handle(local)
    a.release_dlist_handle(remote)
    a.remove_remote_agent("B")
    a.deregister_memory(ra)
    b.deregister_memory(rb)
    assert leaks(a.tent_engine) == {} and leaks(b.tent_engine) == {}
    a.close()
    b.close()


def _done(a, h):
    import time

    for _ in range(2000):
        if a.check_xfer_state(h) == "DONE":
            return
        time.sleep(0.001)
    raise AssertionError("the transfer did not finish")


ID_FORMS = {
    "list": lambda v: v,
    "tuple": tuple,
    "int64 array": lambda v: np.array(v, dtype=np.int64),
    "uint32 array": lambda v: np.array(v, dtype=np.uint32),
}


@pytest.mark.parametrize("form", sorted(ID_FORMS))
def test_nixl_prepped_transfers_move_the_bytes_they_name(agents, form):
    a, b, mem_a, mem_b, local, remote, lens = agents
    f = ID_FORMS[form]
    ids = list(range(0, N, 3))  # every third descriptor, A's i to B's N-1-i
    rids = [N - 1 - i for i in ids]
    h = a.make_prepped_xfer("WRITE", local, f(ids), remote, f(rids), b"done")
    assert a.transfer(h) in ("PROC", "DONE")
    _done(a, h)
    want = np.zeros_like(mem_b)
    for i in ids:
        j = N - 1 - i
        want[j * SLOT:j * SLOT + lens[i]] = mem_a[i * SLOT:i * SLOT + lens[i]]
    assert np.array_equal(mem_b, want)
    tel = a.get_xfer_telemetry(h)
    assert (tel.totalBytes, tel.descCount) == (sum(lens[i] for i in ids), len(ids))
    # posted again after new data: the same columns move it again
    mem_a[:] = _pattern(mem_a.size, 9)
    assert a.transfer(h) in ("PROC", "DONE")
    _done(a, h)
    for i in ids:
        j = N - 1 - i
        assert np.array_equal(mem_b[j * SLOT:j * SLOT + lens[i]], mem_a[i * SLOT:i * SLOT + lens[i]]), i
    a.release_xfer_handle(h)

    # READ all of it back into a zeroed A, by a range of ids
    mem_a[:] = 0
    h = a.make_prepped_xfer("READ", local, range(N), remote, f(range(N - 1, -1, -1)))
    a.transfer(h)
    _done(a, h)
    for i in range(N):
        j = N - 1 - i
        assert np.array_equal(mem_a[i * SLOT:i * SLOT + lens[i]], mem_b[j * SLOT:j * SLOT + lens[i]]), i
    a.release_xfer_handle(h)
    got = []
    for _ in range(500):
        got += b.get_new_notifs().get("A", [])
        if len(got) == 2:
            break
        import time

        time.sleep(0.01)
    assert got == [b"done", b"done"]


def test_nixl_initialize_xfer_moves_the_bytes(agents):
    a, b, mem_a, mem_b, _, _, _ = agents
    local = a.get_xfer_descs([(mem_a.ctypes.data + 3 * SLOT, 100, 0), (mem_a.ctypes.data, 7, 0)], "DRAM")
    remote = a.get_xfer_descs([(mem_b.ctypes.data, 100, 0), (mem_b.ctypes.data + 500, 7, 0)], "DRAM")
    h = a.initialize_xfer("WRITE", local, remote, "B")
    a.transfer(h)
    _done(a, h)
    assert np.array_equal(mem_b[:100], mem_a[3 * SLOT:3 * SLOT + 100])
    assert np.array_equal(mem_b[500:507], mem_a[:7])
    a.release_xfer_handle(h)


def test_nixl_bad_transfers_refused_as_before(agents):
    from nixl._bindings import nixlInvalidParamError

    a, b, mem_a, mem_b, local, remote, lens = agents
    same = [N - 1 - i for i in range(4)]  # B's descriptors with the lengths of A's 0..3
    bad = [
        ("a float id", [0.0, 1, 2, 3], same, nixlInvalidParamError, "indices must be integers"),
        ("a float array", np.array([0, 1, 2, 3], dtype=np.float64), same, nixlInvalidParamError,
         "indices must be integers"),
        ("a str id", ["0", 1, 2, 3], same, nixlInvalidParamError, "indices must be integers"),
        ("a negative id", [-1, 1, 2, 3], same, nixlInvalidParamError, "outside its list"),
        ("an id past the end", [0, 1, 2, N], same, nixlInvalidParamError, "outside its list"),
        ("a remote id past the end", [0, 1, 2, 3], same[:3] + [N], nixlInvalidParamError, "outside its list"),
        ("an id past int64", [0, 1, 2, 1 << 63], same, nixlInvalidParamError, "indices must be integers"),
        ("lists of different lengths", [0, 1, 2], same, nixlInvalidParamError, "3 local and 4 remote"),
        ("no ids", [], [], nixlInvalidParamError, "at least one descriptor"),
        ("pairs of different lengths", [0, 1, 2, 3], [0, 1, 2, 3], nixlInvalidParamError, "descriptor pair 0"),
    ]
    before = mem_b.copy()
    for what, li, ri, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            a.make_prepped_xfer("WRITE", local, li, remote, ri)
        assert leaks(a.tent_engine).get("batches", 0) == 0, what
    with pytest.raises(KeyError):
        a.make_prepped_xfer("COPY", local, [0], remote, [N - 1])
    h = a.make_prepped_xfer("WRITE", local, [0], remote, [N - 1])
    a.release_xfer_handle(h)
    with pytest.raises(nixlInvalidParamError, match="released"):
        a.transfer(h)
    assert np.array_equal(mem_b, before), "a refused transfer moved data"


def test_nixl_transfer_refused_by_the_target_raises(agents):
    from nixl._bindings import _nixlError

    a, b, mem_a, mem_b, _, _, _ = agents
    b.deregister_memory(b.get_reg_descs([(mem_b.ctypes.data, mem_b.nbytes, 0, "")], "DRAM"))
    try:
        local = a.get_xfer_descs([(mem_a.ctypes.data, 64, 0)], "DRAM")
        remote = a.get_xfer_descs([(mem_b.ctypes.data, 64, 0)], "DRAM")
        h = a.initialize_xfer("WRITE", local, remote, "B")  # A's copy of B's metadata still lists it
        with pytest.raises(_nixlError, match="not registered"):
            a.transfer(h)
            _done(a, h)
        a.release_xfer_handle(h)
        assert not mem_b.any()
    finally:
        b.register_memory([(mem_b.ctypes.data, mem_b.nbytes, 0, "")], "DRAM")


def _moved(mem_a, mem_b, lens, ids, rids):
    return all(np.array_equal(mem_b[j * SLOT:j * SLOT + lens[i]], mem_a[i * SLOT:i * SLOT + lens[i]])
               for i, j in zip(ids, rids))


def test_nixl_same_ids_again_reuse_checked_columns_and_move_the_bytes(agents):
    """make_prepped_xfer keeps the checked columns of a (lists, ids) pair:
    made again, the transfer moves the same bytes, however the lists of
    ids were changed meanwhile, and what was refused is still refused."""
    from nixl._bindings import nixlInvalidParamError

    a, b, mem_a, mem_b, local, remote, lens = agents
    ids = [0, 5, 9]
    rids = [N - 1 - i for i in ids]
    for seed in (11, 12, 13):
        mem_a[:] = _pattern(mem_a.size, seed)
        mem_b[:] = 0
        h = a.make_prepped_xfer("WRITE", local, ids, remote, rids)
        a.transfer(h)
        _done(a, h)
        assert _moved(mem_a, mem_b, lens, ids, rids), seed
        assert a.get_xfer_telemetry(h).totalBytes == sum(lens[i] for i in ids)
        a.release_xfer_handle(h)
    cached = a._dlists[local._handle].prepped
    assert len(cached) == 1
    # the same list objects, changed in place: their new ids are moved
    ids[:] = [1, 2]
    rids[:] = [N - 2, N - 3]
    mem_b[:] = 0
    h = a.make_prepped_xfer("WRITE", local, ids, remote, rids)
    a.transfer(h)
    _done(a, h)
    assert _moved(mem_a, mem_b, lens, ids, rids)
    assert not mem_b[(N - 1) * SLOT:].any(), "the cached ids were moved"
    a.release_xfer_handle(h)
    # equal values of another type are still refused, as before
    before = mem_b.copy()
    with pytest.raises(nixlInvalidParamError, match="indices must be integers"):
        a.make_prepped_xfer("WRITE", local, [1.0, 2.0], remote, rids)
    with pytest.raises(nixlInvalidParamError, match="descriptor pair 0"):
        a.make_prepped_xfer("WRITE", local, ids, remote, ids)  # one list for both sides: lengths differ
    assert np.array_equal(mem_b, before)
    # bounded: older pairs give way
    for k in range(40):
        h = a.make_prepped_xfer("READ", local, [k % N], remote, [N - 1 - k % N])
        a.release_xfer_handle(h)
    assert len(cached) <= 16


def test_nixl_spinning_poll_waits_for_the_data_and_raises_a_failure(agents):
    """check_xfer_state called in a tight loop (a short bounded wait each)
    answers DONE once the bytes are there, and raises a failed transfer's
    NIXL error as a spaced poll does."""
    from nixl._bindings import _nixlError

    a, b, mem_a, mem_b, local, remote, lens = agents
    ids = list(range(N))
    rids = [N - 1 - i for i in ids]
    for _ in range(3):
        mem_b[:] = 0
        h = a.make_prepped_xfer("WRITE", local, ids, remote, rids)
        state = a.transfer(h)
        while state != "DONE":
            state = a.check_xfer_state(h)
        assert _moved(mem_a, mem_b, lens, ids, rids)
        assert a.check_xfer_state(h) == "DONE"
        a.release_xfer_handle(h)
    b.deregister_memory(b.get_reg_descs([(mem_b.ctypes.data, mem_b.nbytes, 0, "")], "DRAM"))
    try:
        mem_b[:] = 0
        h = a.make_prepped_xfer("WRITE", local, ids, remote, rids)
        with pytest.raises(_nixlError, match="not registered"):
            state = a.transfer(h)
            while state != "DONE":
                state = a.check_xfer_state(h)
        a.release_xfer_handle(h)
        assert not mem_b.any()
    finally:
        b.register_memory([(mem_b.ctypes.data, mem_b.nbytes, 0, "")], "DRAM")


@pytest.fixture
def no_spin_wait(monkeypatch):
    monkeypatch.setenv("TENT_COMPAT_SPIN_WAIT_MS", "0")


def _spin_loop_waits(a, local, remote, lens, mem_a, mem_b, monkeypatch):
    """Runs tight check_xfer_state loops with the library's first status
    polls of each transfer answered PENDING (as for a transfer still
    running), so every loop polls again at once; returns how often the
    agent then called the library's wait."""
    import time

    from nixl import _api as nixl_api
    from tent import _lib

    engine = a.tent_engine
    count = {"waits": 0, "pending": 0}

    class Spy:
        def __init__(self, fast):
            self._f = fast

        def __getattr__(self, name):
            fn = getattr(self._f, name)
            if name == "tent_batch_wait":
                def wait(*args):
                    count["waits"] += 1
                    return fn(*args)
                return wait
            if name == "tent_batch_status":
                def status(*args):
                    if count["pending"] < 3:
                        count["pending"] += 1
                        return _lib.TENT_PENDING
                    return fn(*args)
                return status
            return fn

    class Clock:
        """time for the agent, its monotonic clock stopped: every poll
        comes "at once" after the one before, whatever the machine's load."""
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def monotonic():
            return 1000.0

    monkeypatch.setattr(engine, "_fast", Spy(engine._fast))
    monkeypatch.setattr(nixl_api, "time", Clock())
    ids = list(range(N))
    rids = [N - 1 - i for i in ids]
    for _ in range(5):
        mem_b[:] = 0
        count["pending"] = 0
        h = a.make_prepped_xfer("WRITE", local, ids, remote, rids)
        state = a.transfer(h)
        while state != "DONE":
            state = a.check_xfer_state(h)
        assert _moved(mem_a, mem_b, lens, ids, rids)
        a.release_xfer_handle(h)
    return count["waits"]


def test_nixl_spin_loop_waits_in_the_library(agents, monkeypatch):
    """By default a poll that comes again at once is answered by the
    library's bounded wait."""
    a, b, mem_a, mem_b, local, remote, lens = agents
    assert _spin_loop_waits(a, local, remote, lens, mem_a, mem_b, monkeypatch) > 0


def test_nixl_spin_wait_off_never_blocks_a_poll(no_spin_wait, agents, monkeypatch):
    """With TENT_COMPAT_SPIN_WAIT_MS=0 (read when the agent is made) a
    tight check_xfer_state loop only ever polls: the library's wait is
    never called, and the data still arrives."""
    a, b, mem_a, mem_b, local, remote, lens = agents
    assert _spin_loop_waits(a, local, remote, lens, mem_a, mem_b, monkeypatch) == 0


@pytest.mark.parametrize("value", ["-1", "1001", "2.5", "soon"])
def test_nixl_spin_wait_refuses_a_bad_value(monkeypatch, value):
    from nixl._api import nixl_agent, nixl_agent_config

    monkeypatch.setenv("TENT_COMPAT_SPIN_WAIT_MS", value)
    with pytest.raises(ValueError, match="TENT_COMPAT_SPIN_WAIT_MS"):
        nixl_agent("bad-wait", nixl_agent_config(backends=["UCX"]))


def test_nixl_notification_naming_a_known_agent_from_another_engine_is_dropped(agents):
    """A notification names its agent inside the message; one that names
    an agent loaded here (or this agent itself) but comes from another
    engine is dropped and counted, the real agent's still arrives, and a
    name not loaded here cannot be checked and is delivered."""
    import time

    import tent
    from tent.compat import _common

    a, b, mem_a, mem_b, local, remote, lens = agents
    b.add_remote_agent(a.get_agent_metadata())
    rogue = tent.Engine(listen_addr="127.0.0.1:0")
    try:
        seg = rogue.open_segment(a.tent_engine.name)
        rogue.notify(seg, _common.envelope(_common.KIND_USER, "B", b"forged by B's name"))
        rogue.notify(seg, _common.envelope(_common.KIND_USER, "A", b"forged by A's own name"))
        rogue.notify(seg, _common.envelope(_common.KIND_USER, "Z", b"from an agent not loaded"))
        b.send_notif("A", b"really from B")
        got = {}
        deadline = time.monotonic() + 10
        while not (got.get("B") and got.get("Z") and a.notifs_refused == 2):
            assert time.monotonic() < deadline, (got, a.notifs_refused)
            for k, v in a.get_new_notifs().items():
                got.setdefault(k, []).extend(v)
            time.sleep(0.002)
        assert got == {"B": [b"really from B"], "Z": [b"from an agent not loaded"]}
        seg.close()
    finally:
        rogue.close()
    b.remove_remote_agent("A")
