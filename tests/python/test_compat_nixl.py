"""NIXL's API on tent, driven the way vLLM's NixlConnector drives it: the
peer (a prefill instance) in its own process (`python -m
tent.compat.clients nixl-peer`), `from nixl._api import nixl_agent` from
the tent-compat wheel, metadata over the application's side channel, the
listen thread and etcd, READs by block ids with a notification, telemetry,
numpy checksums over shm and tcp, a peer killed mid-transfer, and the
errors NIXL clients catch."""

import base64
import time

import numpy as np
import pytest

from compat_fixtures import etcd, peers  # noqa: F401 - fixtures

from tent.compat.clients import NixlDecoder, crcs, kv_layers

LAYERS, BLOCKS, BS, SEED = 2, 32, 16384, 7
TRANSPORTS = ("shm", "tcp")


def _moved(engine, transport):
    t = engine.stats()["transports"][transport]
    return t["bytes"] if transport == "shm" else t["bytes_sent"] + t["bytes_received"]


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


@pytest.mark.parametrize("exchange", ["side_channel", "listen_thread", "etcd"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_vllm_shaped_read_flow(peers, request, monkeypatch, transport, exchange):
    monkeypatch.setenv("TENT_COMPAT_TRANSPORTS", transport)
    env = {"TENT_COMPAT_TRANSPORTS": transport}
    args = ["--layers", LAYERS, "--blocks", BLOCKS, "--block-size", BS, "--seed", SEED]
    if exchange == "listen_thread":
        args += ["--listen", "--listen-port", 0]
    if exchange == "etcd":
        endpoint = request.getfixturevalue("etcd")
        monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", f"http://{endpoint}")
        env["NIXL_ETCD_ENDPOINTS"] = f"http://{endpoint}"
        args += ["--etcd", "--name", f"prefill-{transport}"]
    peer = peers("nixl-peer", *args, env=env)
    ready = peer.ready
    dec = NixlDecoder(LAYERS, BLOCKS, BS)
    try:
        if exchange == "side_channel":
            name = dec.add_peer(ready)
        else:
            if exchange == "listen_thread":
                dec.agent.fetch_remote_metadata(ready["agent"], "127.0.0.1", ready["listen_port"])
            else:
                dec.agent.fetch_remote_metadata(ready["agent"])
            _wait(lambda: dec.agent.check_remote_metadata(ready["agent"]))
            name = ready["agent"]
            dec.prep_remote(name, ready)
        # add_remote_agent returns bytes, as NIXL's bindings do; names work as either
        assert (name.decode() if isinstance(name, bytes) else name) == ready["agent"]

        blocks = [1, 3, 4, 30]
        tel = dec.read_blocks(name, blocks, b"req-1")
        ids = dec.desc_ids(blocks)
        assert tel.totalBytes == len(ids) * BS and tel.descCount == len(ids)
        assert tel.startTime > 0 and tel.xferDuration >= tel.postDuration >= 0
        want = kv_layers(LAYERS, BLOCKS, BS, SEED)
        for layer in range(LAYERS):
            for b in range(BLOCKS):
                got, exp = dec.kv[layer][b * BS:(b + 1) * BS], want[layer][b * BS:(b + 1) * BS]
                if b in blocks:
                    assert np.array_equal(got, exp), (layer, b)
                else:
                    assert not got.any(), (layer, b)
        note = peer.call("wait_notif", msg="req-1")
        assert note["notif_from"] == dec.agent.name  # keyed by the sending agent's name
        assert _moved(dec.agent.tent_engine, transport) >= len(ids) * BS
    finally:
        done = dec.close()
    assert done == {"leaks": {}, "process_handles": 0}
    bye = peer.quit()
    assert bye["leaks"] == {} and bye["process_handles"] == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_write_notification_arrives_after_the_data(peers, monkeypatch, transport):
    # SGLang's nixl backend: the prefill side WRITEs into the decode side and
    # notifies; the receiver checks its memory when the notification lands.
    monkeypatch.setenv("TENT_COMPAT_TRANSPORTS", transport)
    peer = peers("nixl-peer", "--layers", LAYERS, "--blocks", BLOCKS, "--block-size", BS, "--seed", SEED,
                 env={"TENT_COMPAT_TRANSPORTS": transport})
    dec = NixlDecoder(LAYERS, BLOCKS, BS, telemetry=False)
    try:
        src = kv_layers(LAYERS, BLOCKS, BS, 99)
        for mine, data in zip(dec.kv, src):
            mine[:] = data
        name = dec.add_peer(peer.ready)
        blocks = list(range(0, BLOCKS, 2))
        for round_ in range(3):
            msg = f"kv-done-{round_}"
            with pytest.raises(Exception) as info:  # telemetry off: NIXL's error
                dec.read_blocks(name, blocks, msg.encode(), op="WRITE")
            assert type(info.value).__name__ == "nixlNoTelemetryError"
            expected = kv_layers(LAYERS, BLOCKS, BS, SEED)
            for layer in range(LAYERS):
                for b in blocks:
                    expected[layer][b * BS:(b + 1) * BS] = src[layer][b * BS:(b + 1) * BS]
            note = peer.call("wait_notif", msg=msg)
            assert note["notif_from"] == dec.agent.name
            assert note["crc"] == crcs(expected)
        # a standalone notification, the other way round
        assert peer.call("send_notif", agent=dec.agent.name, msg="abort-7",
                         metadata=base64.b64encode(dec.agent.get_agent_metadata()).decode())["sent"]
        _wait(lambda: dec.agent.check_remote_xfer_done(name, b"abort"))
    finally:
        done = dec.close()
    assert done == {"leaks": {}, "process_handles": 0}
    assert peer.quit()["process_handles"] == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_peer_killed_mid_transfer_raises_within_the_deadline(peers, monkeypatch, transport):
    from nixl._bindings import _nixlError

    deadline_s = 3.0
    monkeypatch.setenv("TENT_COMPAT_TRANSPORTS", transport)
    monkeypatch.setenv("TENT_COMPAT_TIMEOUT", str(deadline_s))
    peer = peers("nixl-peer", "--layers", 4, "--blocks", 64, "--block-size", 65536,
                 env={"TENT_COMPAT_TRANSPORTS": transport, "TENT_COMPAT_TIMEOUT": "3"})
    dec = NixlDecoder(4, 64, 65536)
    try:
        name = dec.add_peer(peer.ready)
        dec.read_blocks(name, range(64), b"warm")
        peer.kill()
        start = time.monotonic()
        failed = None
        while time.monotonic() - start < 4 * deadline_s:
            t0 = time.monotonic()
            try:
                dec.read_blocks(name, range(64), b"", timeout=4 * deadline_s)
            except _nixlError as exc:
                failed = (time.monotonic() - t0, exc)
                break
        assert failed is not None, "reads from a killed peer kept succeeding"
        took, exc = failed
        assert took < deadline_s + 2.0, f"the failure took {took:.1f} s"
        assert exc.tent_error is not None and str(exc.tent_error) in str(exc)
    finally:
        done = dec.close()
    assert done["leaks"] == {} and done["process_handles"] == 0


# ---- single-process behaviour of the agent (two agents, loopback) --------------------


@pytest.fixture
def pair():
    from nixl._api import nixl_agent, nixl_agent_config

    a = nixl_agent("A", nixl_agent_config(backends=["UCX"], capture_telemetry=True))
    b = nixl_agent("B", nixl_agent_config(backends=["UCX"]))
    mem_a, mem_b = np.arange(1 << 16, dtype=np.uint8), np.zeros(1 << 16, dtype=np.uint8)
    ra = a.register_memory([(mem_a.ctypes.data, mem_a.nbytes, 0, "")], "DRAM")
    rb = b.register_memory([(mem_b.ctypes.data, mem_b.nbytes, 0, "")], "DRAM")
    yield a, b, mem_a, mem_b
    a.deregister_memory(ra)
    b.deregister_memory(rb)
    a.close()
    b.close()


def test_errors_clients_catch(pair):
    from nixl._bindings import nixlInvalidParamError, nixlNotFoundError, nixlNotPostedError

    a, b, mem_a, mem_b = pair
    with pytest.raises(nixlNotFoundError):
        a.prep_xfer_dlist("nobody", [(mem_b.ctypes.data, 16, 0)], "DRAM")
    name = a.add_remote_agent(b.get_agent_metadata())
    assert name == b"B" and a.check_remote_metadata("B") and a.check_remote_metadata(b"B")
    with pytest.raises(nixlNotFoundError):  # outside what B registered
        a.prep_xfer_dlist("B", [(mem_b.ctypes.data + mem_b.nbytes, 16, 0)], "DRAM")
    with pytest.raises(nixlNotFoundError):  # local memory not registered
        a.prep_xfer_dlist("NIXL_INIT_AGENT", [(mem_b.ctypes.data, 16, 0)], "DRAM")
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(mem_a.ctypes.data + i * 256, 256, 0) for i in range(4)], "DRAM")
    remote = a.prep_xfer_dlist("B", [(mem_b.ctypes.data + i * 256, 256, 0) for i in range(4)], "DRAM")
    with pytest.raises(nixlInvalidParamError):
        a.make_prepped_xfer("WRITE", local, [0, 9], remote, [0, 1])
    with pytest.raises(KeyError):  # NIXL looks the op up in nixl_ops
        a.make_prepped_xfer("COPY", local, [0], remote, [0])
    h = a.make_prepped_xfer("WRITE", local, [0, 1, 2, 3], remote, [3, 2, 1, 0], b"w")
    with pytest.raises(nixlNotPostedError):
        a.check_xfer_state(h)
    assert a.transfer(h) in ("PROC", "DONE")
    _wait(lambda: a.check_xfer_state(h) == "DONE")
    for i in range(4):
        assert np.array_equal(mem_b[(3 - i) * 256:(4 - i) * 256], mem_a[i * 256:(i + 1) * 256])
    assert a.transfer(h) in ("PROC", "DONE")  # a finished transfer may be posted again
    _wait(lambda: a.check_xfer_state(h) == "DONE")
    tel = a.get_xfer_telemetry(h)
    assert (tel.totalBytes, tel.descCount) == (1024, 4)
    a.release_xfer_handle(h)
    a.release_dlist_handle(local)
    a.release_dlist_handle(remote)
    got = []
    _wait(lambda: got.extend(b.get_new_notifs().get("A", [])) or got == [b"w", b"w"])
    a.remove_remote_agent("B")
    a.remove_remote_agent("B")  # NIXL drops this call's status: a second teardown is no error
    assert not a.check_remote_metadata("B")


def test_forged_metadata_grants_nothing_beyond_the_registration(pair):
    # A blob claiming more memory than B registered passes the client-side
    # check; the target (B's engine) still refuses what it never granted.
    from tent.compat import _blob
    from nixl._bindings import _nixlError

    a, b, mem_a, mem_b = pair
    _, body = _blob.decode(b.get_agent_metadata(), None)
    body["regions"][0][1] *= 4
    a.add_remote_agent(_blob.encode("nixl-agent", body, None))
    beyond = mem_b.ctypes.data + mem_b.nbytes
    local = a.get_xfer_descs([(mem_a.ctypes.data, 4096, 0)], "DRAM")
    remote = a.get_xfer_descs([(beyond, 4096, 0)], "DRAM")
    h = a.initialize_xfer("READ", local, remote, "B")
    before = mem_a.copy()
    with pytest.raises(_nixlError) as info:
        a.transfer(h)
        _wait(lambda: a.check_xfer_state(h) == "DONE", 10)
    assert "not registered" in str(info.value)
    assert np.array_equal(mem_a, before)
    a.release_xfer_handle(h)


def test_metadata_and_descriptors_are_not_pickle(pair, monkeypatch):
    from nixl._bindings import nixlInvalidParamError, nixlNotAllowedError, nixlXferDList

    a, b, mem_a, mem_b = pair
    blob = a.get_agent_metadata()
    assert blob.startswith(b"TENTBLOB") and not blob.startswith(b"\x80")
    descs = a.get_xfer_descs([(1, 2, 0), (3, 4, 0)], "DRAM")
    ser = a.get_serialized_descs(descs)
    back = a.deserialize_descs(ser)
    assert isinstance(back, nixlXferDList) and list(back) == [(1, 2, 0), (3, 4, 0)] and back == descs
    import pickle

    with pytest.raises(nixlInvalidParamError):
        a.deserialize_descs(pickle.dumps(descs))
    with pytest.raises(nixlInvalidParamError):
        a.add_remote_agent(b"garbage")
    # a secret makes blobs signed: an unsigned blob, or another secret's, is refused
    from nixl._api import nixl_agent

    monkeypatch.setenv("TENT_COMPAT_SECRET", "s3cret")
    c = nixl_agent("C")
    try:
        with pytest.raises(nixlNotAllowedError):
            c.add_remote_agent(blob)
        signed = c.get_agent_metadata()
        monkeypatch.setenv("TENT_COMPAT_SECRET", "other")
        d = nixl_agent("D")
        try:
            with pytest.raises(nixlNotAllowedError):
                d.add_remote_agent(signed)
        finally:
            d.close()
    finally:
        c.close()


def test_empty_name_and_unknown_memory_type_raise_as_in_nixl(pair):
    from nixl._api import nixl_agent

    a, _, _, _ = pair
    with pytest.raises(ValueError):
        nixl_agent("")
    with pytest.raises(KeyError):
        a.get_xfer_descs([(1, 2, 0)], "V-RAM")
    assert a.get_xfer_descs([(1, 2, 0, 4)], "DRAM") is None  # a 4-tuple is no transfer descriptor


def test_descriptor_inputs(pair):
    a, _, mem_a, _ = pair
    rows = np.array([[mem_a.ctypes.data, 128, 0], [mem_a.ctypes.data + 128, 128, 0]], dtype=np.uint64)
    x = a.get_xfer_descs(rows, "DRAM")
    assert x.descCount() == 2 and x[1] == (mem_a.ctypes.data + 128, 128, 0)
    r = a.get_reg_descs(rows, "DRAM")
    assert r[0] == (mem_a.ctypes.data, 128, 0, b"")  # meta info comes back as bytes, as from NIXL
    assert a.get_xfer_descs([(1, 2, 0)]) is None  # NIXL: no mem type, logged, None
    assert a.get_reg_descs(x) is None
    assert a.query_memory([(mem_a.ctypes.data, 64, 0, "")], "UCX", "DRAM")[0] is not None
    assert a.query_memory([(8, 64, 0, "")], "UCX", "DRAM") == [None]


def test_utils_helpers(pair):
    import nixl._utils as utils

    a, b, _, _ = pair
    addr = utils.malloc_passthru(1024)
    assert addr and addr % 4096 == 0
    try:
        utils.ba_buf(addr, 1024)
        reg = a.get_reg_descs([(addr, 1024, 0, "test")], "DRAM")
        assert a.register_memory(reg) is not None
        assert b.add_remote_agent(a.get_agent_metadata()) == a.name.encode()
        mine = np.full(1024, 0xBA, dtype=np.uint8)
        utils.verify_transfer(addr, mine.ctypes.data, 1024)
        mine[7] = 0
        with pytest.raises(AssertionError):
            utils.verify_transfer(addr, mine.ctypes.data, 1024)
        b.remove_remote_agent(a.name)
        a.deregister_memory(reg)
    finally:
        utils.free_passthru(addr)


def test_threads_share_one_connection_per_peer(pair):
    # vLLM prepares and polls from several threads; every thread's transfers
    # must land, over one segment per peer however the first dials race.
    import threading

    a, b, mem_a, mem_b = pair
    a.add_remote_agent(b.get_agent_metadata())
    blk = 1024
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(mem_a.ctypes.data + i * blk, blk, 0) for i in range(64)], "DRAM")
    remote = a.prep_xfer_dlist("B", [(mem_b.ctypes.data + i * blk, blk, 0) for i in range(64)], "DRAM")
    start, errors = threading.Barrier(8), []

    def worker(t):
        try:
            start.wait()
            for _ in range(10):
                ids = list(range(t * 8, t * 8 + 8))
                h = a.make_prepped_xfer("WRITE", local, ids, remote, ids)
                a.transfer(h)
                _wait(lambda: a.check_xfer_state(h) == "DONE")
                a.release_xfer_handle(h)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert np.array_equal(mem_b, mem_a)
    assert a.tent_engine.stats()["segments"] == 1
    a.release_dlist_handle(local)
    a.release_dlist_handle(remote)
    a.remove_remote_agent("B")
    assert a.tent_engine.stats()["segments"] == 0


def test_close_while_the_listen_thread_serves_a_peer_does_not_deadlock():
    # A peer's invalidate_local_metadata arriving while the agent closes:
    # the listen thread serving it needs the agent's lock, so close() must
    # not hold that lock while it waits for the thread. Gates make the
    # interleaving exact: the request is held inside the listen thread
    # until close() is waiting for that thread.
    import threading

    from nixl._api import nixl_agent, nixl_agent_config

    a = nixl_agent("closing", nixl_agent_config(True, True, 0))
    peer = nixl_agent("peer", nixl_agent_config())
    entered, gate, closing = threading.Event(), threading.Event(), threading.Event()
    serve, listener = a._serve_side, a._listener
    stop_listener = listener.close

    def held_serve(op, body):
        entered.set()
        gate.wait(30)
        return serve(op, body)

    def announced_close():
        closing.set()
        stop_listener()

    a._serve_side, listener.close = held_serve, announced_close
    try:
        peer.invalidate_local_metadata("127.0.0.1", a.listen_port)
        assert entered.wait(10), "the listen thread did not get the request"
        closer = threading.Thread(target=a.close, daemon=True)
        closer.start()
        assert closing.wait(10), "close() did not stop the listen thread"
        gate.set()
        closer.join(10)
        assert not closer.is_alive(), "close() deadlocked with the listen thread"
        assert a.tent_engine.closed
    finally:
        gate.set()
        peer.close()
