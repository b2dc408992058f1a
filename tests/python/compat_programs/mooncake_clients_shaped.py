"""A prefill (sender) and a decode (receiver) worker calling Mooncake's
Python API the way the inference servers' connectors call it, each its
own process:

- vLLM's MooncakeConnector: ``TransferEngine()``,
  ``initialize(get_ip(), "P2PHANDSHAKE", "rdma", "")`` (the host's own
  address, not loopback, when it has one), the session
  ``f"{host}:{get_rpc_port()}"`` handed to the peer over the side
  channel, ``batch_register_memory`` of the KV caches, and the sender's
  thread pool (10 workers) calling
  ``batch_transfer_sync_write(session, src_ptrs, dst_ptrs, lengths)``
  with contiguous blocks coalesced into one longer copy, 0 or a negative
  code;
- SGLang's MooncakeTransferEngine: ``transfer_sync_write`` of one
  region, ``register_memory``/``unregister_memory`` of a scratch buffer,
  ``batch_transfer_async_write`` with numpy int64 columns polled with
  ``get_batch_transfer_status([batch_id])``, ``send_probe(session)`` and
  ``get_engine()``; its failed-session recovery: a receiver that dies
  makes the writes fail (within the deadline) and the probe fail, and a
  receiver restarted on the same ``host:port`` answers the probe and
  takes writes again.

Memory is numpy; the receiver reports the crc32 of what it holds, which
the driver compares with what the sender's seed says. The last stdout
line of each side is a JSON report (tent's leak counts when on tent).

    python mooncake_clients_shaped.py receiver [--port P]  # {"ready": ...}; reports and exits on stdin "stop"
    python mooncake_clients_shaped.py sender               # reads sessions from stdin, one JSON line per phase
"""

import argparse
import json
import socket
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mooncake.engine import TransferEngine

LAYERS, BLOCKS, BLOCK_LEN = 4, 64, 4096
REQS = {"r0": ([0, 1, 2, 3], [10, 11, 12, 13]), "r1": ([8, 20, 21], [30, 31, 40]),
        "r2": ([50], [63]), "r3": ([4, 5, 6, 7, 9], [0, 1, 2, 3, 5])}  # src block ids -> dst block ids
SYNC_ONE = (60, 60)  # SGLang's transfer_sync_write: layer 0 block 60
ASYNC = [(61, 61), (62, 62)]  # SGLang's async batch (layer 1)
AFTER_RESTART = [(33, 33)]  # written into a restarted receiver (every layer)
SENDER_SEED = 5


def get_ip():
    """The host's address as vLLM's get_ip finds it (a UDP socket's source
    address), loopback when there is no route."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def sender_caches():
    return [np.random.default_rng(SENDER_SEED + layer).integers(0, 256, BLOCKS * BLOCK_LEN, dtype=np.uint8)
            for layer in range(LAYERS)]


def blk(arr, b, n=1):
    return arr[b * BLOCK_LEN:(b + n) * BLOCK_LEN]


def crc(a):
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def expected_receiver_crcs(restarted):
    """crc32 of every block of every layer the receiver holds at the end."""
    src = sender_caches()
    dst = [np.zeros(BLOCKS * BLOCK_LEN, np.uint8) for _ in range(LAYERS)]
    if restarted:
        for s, d in AFTER_RESTART:
            for layer in range(LAYERS):
                blk(dst[layer], d)[:] = blk(src[layer], s)
    else:
        for s_ids, d_ids in REQS.values():
            for layer in range(LAYERS):
                for s, d in zip(s_ids, d_ids):
                    blk(dst[layer], d)[:] = blk(src[layer], s)
        blk(dst[0], SYNC_ONE[1])[:] = blk(src[0], SYNC_ONE[0])
        for s, d in ASYNC:
            blk(dst[1], d)[:] = blk(src[1], s)
    return [[crc(blk(dst[layer], b)) for b in range(BLOCKS)] for layer in range(LAYERS)]


def tent_counts(engine):
    inner = engine.get_engine()
    if not hasattr(inner, "stats"):
        return {}
    s = inner.stats()
    leaks = {k: s[k] for k in ("regions", "registered_bytes", "batches", "requests_in_flight", "allocations") if s[k]}
    moved = {t: v.get("bytes", 0) + v.get("bytes_sent", 0) + v.get("bytes_received", 0)
             for t, v in s["transports"].items()}
    return {"leaks": leaks, "moved": moved}


def close(engine):
    counts = tent_counts(engine)
    if hasattr(engine, "close"):
        engine.close()
        import tent

        with tent.Engine() as probe:
            counts["process_handles"] = int(probe.stats()["process_handles"]) - 1
    return counts


def new_engine(hostname):
    engine = TransferEngine()
    if engine.initialize(hostname, "P2PHANDSHAKE", "rdma", "") != 0:
        raise RuntimeError("Mooncake Transfer Engine initialization failed.")
    return engine


def receiver(args):
    host = get_ip()
    engine = new_engine(f"{host}:{args.port}" if args.port else host)
    caches = [np.zeros(BLOCKS * BLOCK_LEN, np.uint8) for _ in range(LAYERS)]
    if engine.batch_register_memory([c.ctypes.data for c in caches], [c.nbytes for c in caches]) != 0:
        raise RuntimeError("Mooncake batch memory registration failed.")
    session = f"{host}:{engine.get_rpc_port()}"
    print(json.dumps({"ready": True, "session": session, "base": [c.ctypes.data for c in caches]}), flush=True)
    sys.stdin.readline()
    crcs = [[crc(blk(c, b)) for b in range(BLOCKS)] for c in caches]
    unregistered = engine.batch_unregister_memory([c.ctypes.data for c in caches])
    print(json.dumps({"crcs": crcs, "unregistered": unregistered, **close(engine)}), flush=True)
    return 0


def sender(args):
    host = get_ip()
    engine = new_engine(host)
    caches = sender_caches()
    assert engine.batch_register_memory([c.ctypes.data for c in caches], [c.nbytes for c in caches]) == 0
    peer = json.loads(sys.stdin.readline())
    session, base = peer["session"], peer["base"]
    out = {"probe": engine.send_probe(session), "engine": engine.get_engine() is not None}

    def plan(s_ids, d_ids):
        """vLLM's transfer params: contiguous runs coalesced into one copy."""
        src, dst, lengths = [], [], []
        runs, start = [], 0
        for i in range(1, len(s_ids) + 1):
            if i == len(s_ids) or s_ids[i] != s_ids[i - 1] + 1 or d_ids[i] != d_ids[i - 1] + 1:
                runs.append((s_ids[start], d_ids[start], i - start))
                start = i
        for layer in range(LAYERS):
            for s, d, n in runs:
                src.append(caches[layer].ctypes.data + s * BLOCK_LEN)
                dst.append(base[layer] + d * BLOCK_LEN)
                lengths.append(n * BLOCK_LEN)
        return src, dst, lengths

    with ThreadPoolExecutor(max_workers=10) as pool:
        rets = list(pool.map(lambda r: engine.batch_transfer_sync_write(session, *plan(*r)), REQS.values()))
    out["batch_sync"] = rets
    out["sync"] = engine.transfer_sync_write(session, caches[0].ctypes.data + SYNC_ONE[0] * BLOCK_LEN,
                                             base[0] + SYNC_ONE[1] * BLOCK_LEN, BLOCK_LEN)
    scratch = np.zeros(BLOCK_LEN, np.uint8)
    out["scratch"] = [engine.register_memory(scratch.ctypes.data, scratch.nbytes),
                      engine.unregister_memory(scratch.ctypes.data)]
    src = np.array([caches[1].ctypes.data + s * BLOCK_LEN for s, _ in ASYNC], dtype=np.int64)
    dst = np.array([base[1] + d * BLOCK_LEN for _, d in ASYNC], dtype=np.int64)
    batch_id = engine.batch_transfer_async_write(session, src, dst, np.full(len(ASYNC), BLOCK_LEN, dtype=np.int64))
    out["async"] = [batch_id != 0, engine.get_batch_transfer_status([batch_id])]
    print(json.dumps(out), flush=True)

    # the receiver is gone (the driver killed it): writes and probes fail, never hang
    sys.stdin.readline()
    src, dst, lengths = plan(*REQS["r0"])
    t0 = time.monotonic()
    out = {"dead_write": engine.batch_transfer_sync_write(session, src, dst, lengths),
           "dead_probe": engine.send_probe(session), "dead_s": time.monotonic() - t0}
    print(json.dumps(out), flush=True)

    # a receiver restarted on the same host:port: the probe answers again, writes land
    peer = json.loads(sys.stdin.readline())
    assert peer["session"] == session, (peer, session)
    base = peer["base"]
    deadline = time.monotonic() + 30
    while engine.send_probe(session) != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    src, dst, lengths = [], [], []
    for s, d in AFTER_RESTART:
        for layer in range(LAYERS):
            src.append(caches[layer].ctypes.data + s * BLOCK_LEN)
            dst.append(base[layer] + d * BLOCK_LEN)
            lengths.append(BLOCK_LEN)
    out = {"restart_probe": engine.send_probe(session),
           "restart_write": engine.batch_transfer_sync_write(session, src, dst, lengths)}
    engine.batch_unregister_memory([c.ctypes.data for c in caches])
    out.update(close(engine))
    print(json.dumps(out), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=("receiver", "sender"))
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    return receiver(args) if args.role == "receiver" else sender(args)


if __name__ == "__main__":
    sys.exit(main())
