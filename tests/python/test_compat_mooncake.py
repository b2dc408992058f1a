"""Mooncake's API on tent, driven the way SGLang drives it: two processes
(the target in its own, started with `python -m tent.compat.clients
mooncake-target`), `from mooncake.engine import TransferEngine` from the
tent-compat wheel, numpy checksums, over shm and tcp, with P2PHANDSHAKE,
etcd and Mooncake's HTTP metadata; a target killed mid-transfer; leak
counts back to zero after teardown."""

import time
import urllib.error
import urllib.request
import zlib

import numpy as np
import pytest

from compat_fixtures import etcd, http_metadata_server, peers, server_port  # noqa: F401 - fixtures

from tent.compat.clients import MooncakeInitiator, crcs, kv_layers

LAYERS, BLOCKS, BS = 4, 64, 16384
# protocol -> the tent transport that must have served two processes on one host
PROTOCOLS = {"rdma": "shm", "tcp": "tcp"}


def _moved(engine, transport):
    t = engine.stats()["transports"][transport]
    return t["bytes"] if transport == "shm" else t["bytes_sent"] + t["bytes_received"]


def _names(kind, etcd_ep, http_url):
    """(metadata string, target hostname, initiator hostname)."""
    if kind == "p2p":
        return "P2PHANDSHAKE", "127.0.0.1", "127.0.0.1"
    meta = etcd_ep if kind == "etcd" else http_url  # a bare host:port means etcd, as in Mooncake
    return meta, f"127.0.0.1:{server_port()}", f"127.0.0.1:{server_port()}"


@pytest.fixture(params=["p2p", "etcd", "http"])
def metadata(request):
    kind = request.param
    if kind == "etcd":
        return kind, request.getfixturevalue("etcd"), None
    if kind == "http":
        return kind, None, request.getfixturevalue("http_metadata_server")
    return kind, None, None


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_sglang_shaped_flow(peers, metadata, protocol):
    kind, etcd_ep, http_url = metadata
    meta, target_host, init_host = _names(kind, etcd_ep, http_url)
    target = peers("mooncake-target", "--hostname", target_host, "--metadata", meta, "--protocol", protocol,
                   "--layers", LAYERS, "--blocks", BLOCKS, "--block-size", BS)
    session, peer_ptrs = target.ready["session"], target.ready["ptrs"]
    init = MooncakeInitiator(init_host, meta, protocol, LAYERS, BLOCKS, BS, seed=3)
    try:
        blocks = [0, 5, 6, 7, 31, 63]
        assert init.send(session, peer_ptrs, blocks) == [0] * LAYERS
        expected = kv_layers(LAYERS, BLOCKS, BS, None)
        for layer, src in zip(expected, init.kv):
            for b in blocks:
                layer[b * BS:(b + 1) * BS] = src[b * BS:(b + 1) * BS]
        assert target.call("crc")["crc"] == crcs(expected)
        assert _moved(init.engine.get_engine(), PROTOCOLS[protocol]) >= LAYERS * len(blocks) * BS

        # reads back what was written, into a zeroed local buffer
        init.kv[0][:] = 0
        rc = init.engine.batch_transfer_sync_read(session, [init.ptrs[0] + b * BS for b in blocks],
                                                  [peer_ptrs[0] + b * BS for b in blocks], [BS] * len(blocks))
        assert rc == 0
        for b in blocks:
            assert zlib.crc32(init.kv[0][b * BS:(b + 1) * BS]) == zlib.crc32(expected[0][b * BS:(b + 1) * BS])
    finally:
        done = init.close()
    assert done == {"rc": 0, "leaks": {}, "process_handles": 0}
    bye = target.quit()
    assert bye["rc"] == 0 and bye["leaks"] == {} and bye["process_handles"] == 0


def test_async_batches_first_buffer_and_notify(peers, etcd):
    meta = f"etcd://{etcd}"
    target_host, init_host = f"127.0.0.1:{server_port()}", f"127.0.0.1:{server_port()}"
    target = peers("mooncake-target", "--hostname", target_host, "--metadata", meta, "--protocol", "rdma",
                   "--layers", 1, "--blocks", 8, "--block-size", 4096)
    from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

    engine = TransferEngine()
    assert engine.initialize(init_host, meta, "rdma", "") == 0
    try:
        # the peer's first registered buffer, asked of the peer itself
        dst = engine.get_first_buffer_address(target_host)
        assert dst == target.ready["ptrs"][0], (engine.last_error, target.stderr())
        src = engine.allocate_managed_buffer(8 * 4096)
        assert src != 0
        assert engine.get_first_buffer_address(init_host) == src
        payload = bytes(range(256)) * 16
        assert engine.write_bytes_to_buffer(src, payload, len(payload)) == 0
        assert engine.read_bytes_from_buffer(src, 16) == payload[:16]

        bid = engine.batch_transfer_async_write(target_host, [src], [dst], [4096])
        assert bid > 0
        assert engine.get_batch_transfer_status([bid]) == 0
        bid = engine.transfer_submit_write(target_host, src, dst + 4096, 4096)
        deadline = time.monotonic() + 10
        while (st := engine.transfer_check_status(bid)) == 0:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert st == 1

        # a notify reaches the target after the data it follows
        note = TransferNotify("req-9", "kv ready")
        assert engine.transfer_sync(target_host, src, dst + 2 * 4096, 4096, TransferOpcode.Write, note) == 0
        got = target.call("notifies", count=1)
        assert got["notifies"] == [{"name": "req-9", "msg": "kv ready"}]
        expected = np.zeros(8 * 4096, dtype=np.uint8)
        expected[:3 * 4096] = np.frombuffer(payload, dtype=np.uint8).reshape(1, -1).repeat(3, 0).reshape(-1)
        assert got["crc"] == [zlib.crc32(expected)]

        # outside what the target registered: refused by the target, a code
        assert engine.transfer_sync_write(target_host, src, dst + 8 * 4096, 16) < 0
        assert "not registered" in engine.last_error
        assert engine.send_probe(target_host) == 0
        assert engine.free_managed_buffer(src, 8 * 4096) == 0
        assert engine.free_managed_buffer(src, 8 * 4096) < 0
    finally:
        engine.close()
    bye = target.quit()
    assert bye["leaks"] == {} and bye["process_handles"] == 0


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_target_killed_mid_transfer_fails_within_the_deadline(peers, protocol, monkeypatch):
    deadline_s = 3.0
    monkeypatch.setenv("TENT_COMPAT_TIMEOUT", str(deadline_s))
    target = peers("mooncake-target", "--metadata", "P2PHANDSHAKE", "--protocol", protocol,
                   "--layers", 4, "--blocks", 64, "--block-size", 65536, env={"TENT_COMPAT_TIMEOUT": "3"})
    init = MooncakeInitiator("127.0.0.1", "P2PHANDSHAKE", protocol, 4, 64, 65536)
    try:
        session, ptrs = target.ready["session"], target.ready["ptrs"]
        assert init.send(session, ptrs, range(64)) == [0] * 4
        target.kill()
        start = time.monotonic()
        failed = None
        while time.monotonic() - start < 4 * deadline_s:
            t0 = time.monotonic()
            codes = init.send(session, ptrs, range(64))
            if any(c < 0 for c in codes):
                failed = time.monotonic() - t0
                break
        assert failed is not None, "writes to a killed target kept succeeding"
        assert failed < deadline_s + 2.0, f"the failure took {failed:.1f} s, past the {deadline_s} s deadline"
        assert init.engine.last_error
    finally:
        done = init.close()
    assert done["leaks"] == {} and done["process_handles"] == 0


def test_initialize_failures_are_codes():
    from mooncake.engine import TransferEngine

    e = TransferEngine()
    assert e.initialize("127.0.0.1", "redis://127.0.0.1:1", "tcp", "") < 0
    assert "redis" in e.last_error
    assert e.register_memory(0x1000, 16) < 0  # not initialized: a code, never an exception
    assert e.transfer_sync_write("127.0.0.1:1", 0, 0, 1) < 0
    assert e.batch_transfer_async_write("127.0.0.1:1", [0], [0], [1]) == 0
    e.close()


def test_http_metadata_server_protocol(http_metadata_server):
    url = http_metadata_server

    def call(method, key=None, body=None):
        q = "" if key is None else f"?key={key}"
        req = urllib.request.Request(url + q, data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    assert call("GET", "a")[0] == 404
    assert call("PUT", "a", b"v1")[0] == 200
    assert call("GET", "a") == (200, b"v1")
    assert call("PUT", "a", b"v2")[0] == 200
    assert call("GET", "a") == (200, b"v2")
    assert call("GET")[0] == 400
    assert call("DELETE", "a")[0] == 200
    assert call("DELETE", "a")[0] == 404
    assert call("GET", "a")[0] == 404


def test_bytes_helpers_and_flags():
    import mooncake.engine as me

    assert me.SUPPORT_CUDA is False  # no transfer_*_on_cuda here
    e = me.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        addr = e.allocate_managed_buffer(64)
        assert e.write_bytes_to_buffer(addr, "héllo", 6) == 0  # str: its UTF-8 bytes, as pybind passes them
        assert e.read_bytes_from_buffer(addr, 6) == "héllo".encode()
        assert e.write_bytes_to_buffer(addr, b"abc", 4) < 0  # longer than what was given
        assert e.free_managed_buffer(addr, 64) == 0
    finally:
        e.close()


def test_overhead_loop_is_drivable():
    # bench-compare drives these loops; a tiny run proves they still work.
    from tent.compat.clients import overhead

    out = overhead("tcp", block_size=4096, batch=8, iters=2, rounds=1)
    for k in ("tent (mooncake peer)", "mooncake", "tent (nixl peer)", "nixl"):
        assert out["us_per_batch"][k]["best"] > 0
    assert "mooncake_added_percent" in out and "nixl_added_percent" in out
