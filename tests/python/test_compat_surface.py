"""The call surface programs written against the real Mooncake and NIXL
wheels rely on, beyond the client-shaped flows: the argument forms of each
release (positional and keyword), the inputs clients pass (numpy integers,
arrays), the return codes and shapes they compare with, and bad input
answered in the peer's convention (a code for Mooncake, NIXL's exceptions
or None) -- never a crash, never data moved from a mangled request."""

import time

import numpy as np
import pytest


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


# ---- Mooncake ----------------------------------------------------------------------


@pytest.fixture
def mooncake():
    """One engine writing into its own registered memory by its segment name
    (P2PHANDSHAKE: host:rpc port), source and destination halves of one buffer."""
    from mooncake.engine import TransferEngine

    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    mem = np.zeros(1 << 20, dtype=np.uint8)
    assert e.register_memory(mem.ctypes.data, mem.nbytes) == 0
    yield e, f"127.0.0.1:{e.get_rpc_port()}", mem
    assert e.unregister_memory(mem.ctypes.data) == 0
    e.close()


def test_mooncake_registration_codes(mooncake):
    import tent.compat.mooncake as me  # the codes' names (mooncake.engine returns the bare ints)

    e, _, mem = mooncake
    base = mem.ctypes.data
    # Mooncake's error.h: a double (or overlapping) register is ERR_ADDRESS_OVERLAPPED,
    # an unknown address ERR_ADDRESS_NOT_REGISTERED
    assert e.register_memory(base, mem.nbytes) == me.ERR_ADDRESS_OVERLAPPED == -7
    assert e.register_memory(base + 4096, 4096) == -7
    assert "register_memory" in e.last_error
    assert e.unregister_memory(base + 1) == me.ERR_ADDRESS_NOT_REGISTERED == -3
    assert e.batch_unregister_memory([base + 1]) == -3
    other = np.zeros(8192, dtype=np.uint8)
    # all or none: one overlapping entry registers nothing
    assert e.batch_register_memory([other.ctypes.data, base], [other.nbytes, 4096]) == -7
    assert e.unregister_memory(other.ctypes.data) == -3
    assert e.batch_register_memory([other.ctypes.data], [other.nbytes]) == 0
    assert e.batch_unregister_memory([other.ctypes.data]) == 0
    assert e.register_memory(base, 0) < 0
    with pytest.raises(TypeError, match="incompatible function arguments"):  # size_t: as the bindings
        e.register_memory(base, -1)


def test_mooncake_batch_inputs(mooncake):
    e, peer, mem = mooncake
    base, half, n, bs = mem.ctypes.data, mem.nbytes // 2, 16, 4096
    mem[:half] = np.arange(half, dtype=np.uint64).astype(np.uint8)
    src = [base + i * bs for i in range(n)]
    dst = [base + half + i * bs for i in range(n)]
    lens = [bs] * n
    # numpy integers inside the lists (clients compute addresses with numpy), and numpy arrays
    assert e.batch_transfer_sync_write(peer, [np.uint64(a) for a in src], dst, [np.int64(x) for x in lens]) == 0
    assert np.array_equal(mem[half:half + n * bs], mem[:n * bs])
    mem[half:] = 0
    assert e.batch_transfer_sync_write(peer, np.array(src), np.array(dst, dtype=np.uint64), np.array(lens)) == 0
    assert np.array_equal(mem[half:half + n * bs], mem[:n * bs])
    assert e.batch_transfer_sync_read(peer, dst, src, lens) == 0
    assert e.batch_transfer_sync_write(peer, [], [], []) == 0  # nothing to do
    mem[half:] = 0
    # what the bindings cannot convert to uintptr_t / size_t: their TypeError
    refused = {
        "float address": ([float(src[0])] + src[1:], dst, lens),
        "float length": (src, dst, [bs + 0.5] + lens[1:]),
        "negative address": ([-1] + src[1:], dst, lens),
        "address past 2**64": ([1 << 64] + src[1:], dst, lens),
        "strings": ([str(a) for a in src], dst, lens),
        "float array": (np.array(src, dtype=np.float64), dst, lens),
        "negative array": (src, np.array([-1] * n), lens),
    }
    for what, (s, d, ln) in refused.items():
        for call in (e.batch_transfer_sync_write, e.batch_transfer_async_write):
            with pytest.raises(TypeError, match="incompatible function arguments"):
                call(peer, s, d, ln)
    # what converts but tent refuses: a code
    bad = {
        "range past 2**64": ([(1 << 64) - 8] + src[1:], dst, lens),
        "zero length": (src, dst, lens[:-1] + [0]),
        "lists of different lengths": (src, dst[:-1], lens),
        "unregistered local memory": ([a + (1 << 40) for a in src], dst, lens),
    }
    for what, (s, d, ln) in bad.items():
        assert e.batch_transfer_sync_write(peer, s, d, ln) == -1, what
        assert e.last_error, what
        assert e.batch_transfer_async_write(peer, s, d, ln) == 0, what  # Mooncake: batch id 0 on failure
    assert not mem[half:].any(), "a refused request moved data"


def test_mooncake_async_batches_and_status(mooncake):
    e, peer, mem = mooncake
    base, half, bs = mem.ctypes.data, mem.nbytes // 2, 8192
    mem[:half] = 7
    ids = [e.batch_transfer_async_write(peer, [base + i * bs], [base + half + i * bs], [bs]) for i in range(4)]
    assert all(isinstance(i, int) and i > 0 for i in ids) and len(set(ids)) == 4
    assert e.get_batch_transfer_status(ids) == 0
    assert (mem[half:half + 4 * bs] == 7).all()
    assert e.get_batch_transfer_status(ids) == -1  # released by the first call: unknown now
    bid = e.transfer_submit_write(peer, base, base + half, bs)
    assert bid > 0
    _wait(lambda: e.transfer_check_status(bid) != 0)
    assert e.transfer_check_status(bid) == -1  # released once answered
    assert e.get_batch_transfer_status([12345678]) == -1


def test_mooncake_initialize_ext_and_reinitialize():
    from mooncake.engine import TransferEngine

    e = TransferEngine()
    try:
        assert e.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "p2p") == 0
        assert e.get_rpc_port() > 0
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") < 0  # already initialized: a code
        assert "already initialized" in e.last_error
    finally:
        e.close()
    e2 = TransferEngine()
    assert e2.initialize_ext("127.0.0.1", "127.0.0.1:1", "tcp", "", "redis") < 0
    e2.close()


# ---- NIXL --------------------------------------------------------------------------


@pytest.fixture
def agents():
    from nixl._api import nixl_agent, nixl_agent_config

    # positional, in the order of NIXL's nixl_agent_config
    a = nixl_agent("A", nixl_agent_config(True, False, 0, True, 0, ["UCX"]))
    b = nixl_agent("B", nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
    mem_a, mem_b = np.arange(1 << 16, dtype=np.uint8), np.zeros(1 << 16, dtype=np.uint8)
    yield a, b, mem_a, mem_b
    a.close()
    b.close()


def test_nixl_descriptor_and_registration_kwargs_of_each_release(agents):
    from nixl._bindings import nixlRegDList, nixlXferDList

    a, b, mem_a, mem_b = agents
    # older releases: is_unified_addr / is_sorted positionally and by keyword; backend= one name
    regs = a.get_reg_descs([(mem_a.ctypes.data, mem_a.nbytes, 0, "")], "DRAM", True, False)
    assert isinstance(regs, nixlRegDList) and len(regs) == 1
    assert isinstance(a.get_reg_descs([(mem_a.ctypes.data, 16, 0, "")], mem_type="DRAM", is_sorted=True),
                      nixlRegDList)
    ra = a.register_memory(regs, "DRAM", backend="UCX")
    rb = b.register_memory([(mem_b.ctypes.data, mem_b.nbytes, 0, "")], "DRAM", True, is_sorted=True)
    with pytest.raises(KeyError):
        a.register_memory([(mem_a.ctypes.data, 16, 0, "")], "DRAM", backends=["NOPE"])
    with pytest.raises(TypeError):
        a.register_memory([(mem_a.ctypes.data, 16, 0, "")], "DRAM", backends=5)
    # an Nx3 numpy array of descriptors, with the hints
    rows = np.array([[mem_a.ctypes.data + i * 1024, 1024, 0] for i in range(8)], dtype=np.uint64)
    xd = a.get_xfer_descs(rows, "DRAM", is_sorted=True)
    assert isinstance(xd, nixlXferDList) and len(xd) == 8
    assert a.add_remote_agent(b.get_agent_metadata()) == b"B"
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", rows, "DRAM", is_sorted=True, xfer_backend="UCX")
    remote = a.prep_xfer_dlist("B", [(mem_b.ctypes.data + i * 1024, 1024, 0) for i in range(8)], "DRAM",
                               ["UCX"])
    ids = np.arange(8)  # numpy indices, as connectors compute them
    h = a.make_prepped_xfer("WRITE", local, ids, remote, ids[::-1].copy(), b"", skip_desc_merge=True)
    assert a.transfer(h, "posted") in ("PROC", "DONE")  # transfer(handle, notif_msg)
    _wait(lambda: a.check_xfer_state(h) == "DONE")
    for i in range(8):
        assert np.array_equal(mem_b[(7 - i) * 1024:(8 - i) * 1024], mem_a[i * 1024:(i + 1) * 1024])
    got = {}
    _wait(lambda: [got.setdefault(k, []).extend(v) for k, v in b.get_new_notifs().items()] is not None
          and got.get("A") == [b"posted"])
    assert all(isinstance(k, str) and all(isinstance(m, bytes) for m in v) for k, v in got.items())
    x2 = a.initialize_xfer("READ", a.get_xfer_descs(rows[:2], "DRAM"),
                           a.get_xfer_descs([(mem_b.ctypes.data, 1024, 0), (mem_b.ctypes.data + 1024, 1024, 0)],
                                            "DRAM"), "B", xfer_backend="UCX")
    assert a.transfer(x2) in ("PROC", "DONE")
    _wait(lambda: a.check_xfer_state(x2) == "DONE")
    for x in (h, x2):
        a.release_xfer_handle(x)
    a.release_dlist_handle(local)
    a.release_dlist_handle(remote)
    a.remove_remote_agent("B")
    a.deregister_memory(ra)
    b.deregister_memory(rb)


def test_nixl_bad_descriptor_inputs_answer_as_nixl_does(agents):
    from nixl._bindings import nixlInvalidParamError

    a, _, mem_a, _ = agents
    ra = a.register_memory([(mem_a.ctypes.data, mem_a.nbytes, 0, "")], "DRAM")
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(mem_a.ctypes.data + i * 64, 64, 0) for i in range(4)], "DRAM")
    remote = a.prep_xfer_dlist("A", [(mem_a.ctypes.data + 4096 + i * 64, 64, 0) for i in range(4)], "DRAM")
    for li, ri in (([0, 1], [0]), ([0, -1], [0, 1]), ([0, 4], [0, 1]), ([0.5], [0]), (["x"], [0])):
        with pytest.raises(nixlInvalidParamError):
            a.make_prepped_xfer("READ", local, li, remote, ri, skip_desc_merge=True)
    with pytest.raises(nixlInvalidParamError):
        a.make_prepped_xfer("READ", local, [], remote, [])
    assert a.get_xfer_descs([(mem_a.ctypes.data, 64)], "DRAM") is None  # a 2-tuple: None, as NIXL
    assert a.get_xfer_descs([(mem_a.ctypes.data, 64, 0)]) is None  # no mem type for tuples
    a.release_dlist_handle(local)
    a.release_dlist_handle(remote)
    a.deregister_memory(ra)


def test_mooncake_scalars_are_integers_never_truncated(mooncake):
    e, peer, mem = mooncake
    base, half = mem.ctypes.data, mem.nbytes // 2
    mem[:64] = 9
    # a float address or length is the bindings' TypeError (never truncated)
    for args in ((float(base), base + half, 64), (base, base + half, 64.0), (base + half, float(base), 64)):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            e.transfer_sync_write(peer, *args)
    assert not mem[half:half + 64].any()
    assert e.transfer_sync_write(peer, np.uint64(base), np.int64(base + half), np.int32(64)) == 0
    assert (mem[half:half + 64] == 9).all()
    other = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(TypeError):
        e.register_memory(float(other.ctypes.data), 4096)
    with pytest.raises(TypeError):
        e.batch_register_memory([other.ctypes.data], [4096.0])
    assert e.unregister_memory(other.ctypes.data) == -3  # nothing was registered


def test_mooncake_byte_helpers_stay_inside_this_engines_host_memory(mooncake):
    e, _, mem = mooncake
    base = mem.ctypes.data
    assert e.write_bytes_to_buffer(base + 10, b"abc", 3) == 0
    assert e.read_bytes_from_buffer(base + 10, 3) == b"abc"
    assert bytes(mem[10:13]) == b"abc"
    # outside what this engine registered or allocated: a code / ValueError, where a raw copy would crash
    for addr in (0, 16, base + mem.nbytes - 2, base - 1):
        assert e.write_bytes_to_buffer(addr, b"abcd", 4) == -1, hex(addr)
        with pytest.raises(ValueError):
            e.read_bytes_from_buffer(addr, 4)
    assert e.write_bytes_to_buffer(base, b"abcd", 5) == -1  # more than given
    for bad in (-1, 2.0):
        with pytest.raises(TypeError):
            e.write_bytes_to_buffer(base, b"abcd", bad)
    with pytest.raises(TypeError):
        e.read_bytes_from_buffer(base, -1)
    with pytest.raises(TypeError):
        e.read_bytes_from_buffer(float(base), 4)
    managed = e.allocate_managed_buffer(128)
    assert e.write_bytes_to_buffer(managed + 100, b"x" * 28, 28) == 0
    assert e.write_bytes_to_buffer(managed + 100, b"x" * 29, 29) == -1
    assert e.free_managed_buffer(managed, 128) == 0
    assert e.write_bytes_to_buffer(managed, b"x", 1) == -1  # freed: no longer this engine's


def test_mooncake_port_taken_before_the_bind_is_picked_again(monkeypatch):
    """With a name that is not an address (etcd metadata), the shim picks
    the RPC port itself; a socket that takes it before the engine binds
    must cost another pick, not a failed initialize."""
    import socket

    import tent
    from tent.compat import _common, mooncake

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    picks = []
    real = _common.free_port

    def pick(host):
        picks.append(taken if not picks else real(host))
        return picks[-1]

    monkeypatch.setattr(_common, "free_port", pick)
    try:
        engine, port = mooncake._engine_on_port("127.0.0.1", 0, transports=["tcp"])
        try:
            assert len(picks) == 2 and port == picks[1] != taken
        finally:
            engine.close()
        with pytest.raises(tent.TentError):  # a port the caller named is not replaced
            mooncake._engine_on_port("127.0.0.1", taken, transports=["tcp"])
    finally:
        squatter.close()
