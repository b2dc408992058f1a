"""A prefill and a decode worker calling NIXL's Python API the way the
inference servers' KV connectors call it, each its own process:

- vLLM's NixlConnector (pull): agents named by a uuid with
  ``nixl_agent_config(num_threads=4, capture_telemetry=True)``; KV caches
  registered as ``(addr, len, dev, "")`` rows through ``get_reg_descs`` and
  ``register_memory(descs, backends=["UCX"])``; block descriptors as Nx3
  uint64 arrays (``get_xfer_descs``), prepared once with
  ``"NIXL_INIT_AGENT"`` and with the name ``add_remote_agent`` returned;
  READs by int64 descriptor-id arrays (region-major, as vLLM computes
  them) with ``notif_msg=b"<req>:<consumers>"``; the scheduler's polling
  of ``check_xfer_state`` over every handle, ``get_xfer_telemetry`` read
  as vLLM's stats read it, ``release_xfer_handle``; heartbeats
  (``send_notif(agent, notif_msg=b"HB:...")``) and a binary registration
  notification (vLLM's push mode sends msgpack after a prefix).
- vLLM's push mode: the prefill worker's writer thread posts
  ``make_prepped_xfer("WRITE", ...)`` and drains ``get_new_notifs`` while
  the main thread polls and releases the handles, as NixlPushConnector
  does.
- SGLang's disaggregation/nixl: ``nixl_agent(uuid)`` without a config,
  ``register_memory(rows, "DRAM", is_sorted=True)`` whose result is tested
  for truth, ``get_xfer_descs(tuples, "DRAM", is_sorted=True)``,
  ``initialize_xfer("WRITE", ..., peer_name, notif)`` checked with
  ``if not handle``, ``transfer`` compared with ``"ERR"``, the handles
  polled and never released (dropped for the garbage collector), the
  decode side parsing ``<room>_kv_<chunk>_<last>`` and ``<room>_aux``.

The two talk over their own side channel (a TCP socket, JSON lines), as
the connectors do over ZMQ. Memory is numpy; each side checks what it
received with crc32 against the other side's seed. The last stdout line
is a JSON report, with tent's leak counts when it runs on tent.

    python nixl_clients_shaped.py prefill            # prints {"ready": PORT}
    python nixl_clients_shaped.py decode --port PORT
"""

import argparse
import base64
import json
import socket
import struct
import sys
import threading
import time
import uuid
import zlib

import numpy as np

from nixl._api import nixl_agent, nixl_agent_config

REGIONS, BLOCKS, BLOCK_LEN = 4, 32, 2048  # 2 layers x (K, V), blocks per region
PULL_REQS = {"req-a": [1, 2, 3, 9], "req-b": [4, 5, 30], "req-c": [0]}  # request -> block ids
PUSH_BLOCKS = [10, 11, 12, 20]  # written by the prefill side into the same ids
SGL_ROOM, SGL_BLOCKS, AUX_LEN = 7, [24, 25, 26], 256
TIMEOUT_S = 60.0
PREFILL_SEED, DECODE_SEED = 11, 22


def caches(seed):
    return [np.random.default_rng(seed + r).integers(0, 256, BLOCKS * BLOCK_LEN, dtype=np.uint8)
            for r in range(REGIONS)]


def crc(a):
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def block(arr, b):
    return arr[b * BLOCK_LEN:(b + 1) * BLOCK_LEN]


def until(cond, what):
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.001)


def blocks_data(base_addrs):
    """vLLM's block descriptors: one Nx3 uint64 row per (region, block)."""
    parts = []
    for base in base_addrs:
        out = np.empty((BLOCKS, 3), dtype=np.uint64)
        out[:, 0] = base + np.arange(BLOCKS, dtype=np.uint64) * BLOCK_LEN
        out[:, 1] = BLOCK_LEN
        out[:, 2] = 0
        parts.append(out)
    return np.concatenate(parts)


def desc_ids(block_ids):
    """vLLM's descriptor ids: region-major, an int64 array."""
    return (np.arange(REGIONS)[:, None] * BLOCKS + np.asarray(block_ids)[None, :]).flatten()


def vllm_agent():
    return nixl_agent(str(uuid.uuid4()), nixl_agent_config(num_threads=4, capture_telemetry=True))


def register(agent, arrays):
    rows = [(a.ctypes.data, a.nbytes, 0, "") for a in arrays]
    descs = agent.get_reg_descs(rows, "DRAM")
    agent.register_memory(descs, backends=["UCX"])
    return descs


def send_line(f, obj):
    f.write((json.dumps(obj) + "\n").encode())
    f.flush()


def recv_line(f):
    line = f.readline()
    if not line:
        raise EOFError("side channel closed")
    return json.loads(line)


def b64(b):
    return base64.b64encode(b).decode()


def poll_done(agent, handles, telemetry):
    """vLLM's _pop_done_transfers until every handle is DONE."""
    pending = list(handles)
    deadline = time.monotonic() + TIMEOUT_S
    while pending:
        still = []
        for h in pending:
            state = agent.check_xfer_state(h)
            if state == "DONE":
                t = agent.get_xfer_telemetry(h)
                telemetry.append((t.xferDuration / 1e6, t.postDuration / 1e6, t.totalBytes, t.descCount))
                agent.release_xfer_handle(h)
            elif state == "PROC":
                still.append(h)
            else:
                raise RuntimeError(f"transfer failed: {state}")
        pending = still
        if time.monotonic() > deadline:
            raise TimeoutError("transfers not done")


def report(agents, role, ok, **extra):
    out = {"role": role, "ok": ok, **extra}
    leaks, moved = {}, {}
    for agent in agents:
        engine = getattr(agent, "tent_engine", None)
        if engine is None:
            continue
        s = engine.stats()
        for k in ("regions", "registered_bytes", "batches", "requests_in_flight"):
            if s[k]:
                leaks[k] = leaks.get(k, 0) + s[k]
        for t, v in s["transports"].items():
            moved[t] = moved.get(t, 0) + v.get("bytes", 0) + v.get("bytes_sent", 0) + v.get("bytes_received", 0)
        agent.close()
    if any(getattr(a, "tent_engine", None) is not None for a in agents):
        import tent

        with tent.Engine() as probe:
            out["process_handles"] = int(probe.stats()["process_handles"]) - 1
        out["leaks"], out["moved"] = leaks, moved
    print(json.dumps(out), flush=True)


def prefill(args):
    kv = caches(PREFILL_SEED)
    agent = vllm_agent()  # vLLM's agent: READ by the decode side, pushes WRITEs
    reg = register(agent, kv)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", agent.get_xfer_descs(blocks_data([a.ctypes.data for a in kv]),
                                                                          "DRAM"))
    # SGLang's agent: no config, registration results tested for truth
    sgl = nixl_agent(str(uuid.uuid4()))
    sgl_kv = kv[0]
    aux = np.random.default_rng(PREFILL_SEED + 100).integers(0, 256, AUX_LEN, dtype=np.uint8)
    kv_descs = sgl.register_memory([(sgl_kv.ctypes.data, sgl_kv.nbytes, 0, "")], "DRAM", is_sorted=True)
    aux_descs = sgl.register_memory([(aux.ctypes.data, aux.nbytes, 0, "")], "DRAM", is_sorted=True)
    if not kv_descs or not aux_descs:
        raise RuntimeError("NIXL memory registration failed")

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    print(json.dumps({"ready": srv.getsockname()[1]}), flush=True)
    conn, _ = srv.accept()
    f = conn.makefile("rwb")
    hello = recv_line(f)  # the decode side's handshake: its metadata and KV base addresses
    send_line(f, {"agent_metadata": b64(agent.get_agent_metadata()), "sgl_name": sgl.name,
                  "base": [a.ctypes.data for a in kv], "num_blocks": BLOCKS})
    decode_name = agent.add_remote_agent(base64.b64decode(hello["agent_metadata"]))
    remote = agent.prep_xfer_dlist(decode_name, agent.get_xfer_descs(blocks_data(hello["base"]), "DRAM"))
    sgl_peer = sgl.add_remote_agent(base64.b64decode(hello["sgl_metadata"]))

    # vLLM push: a writer thread owns notifications and posts WRITEs; the
    # main thread polls and releases what it posted, under a lock
    lock = threading.Lock()
    sending, done_reqs, heartbeats, registrations, failures = [], set(), [], [], []
    stop = threading.Event()

    def writer():
        try:
            while not stop.is_set():
                for notifs in agent.get_new_notifs().values():
                    for n in notifs:
                        if n.startswith(b"PUSH_REG:"):
                            ids = list(struct.unpack(f"<{(len(n) - 9) // 8}q", n[9:]))
                            registrations.append(len(n))
                            h = agent.make_prepped_xfer("WRITE", local, desc_ids(ids[:len(PUSH_BLOCKS)]), remote,
                                                        desc_ids(ids[:len(PUSH_BLOCKS)]), notif_msg=b"push-req:1")
                            agent.transfer(h)
                            with lock:
                                sending.append(h)
                        elif n.startswith(b"HB:"):
                            heartbeats.append(n[3:].decode())
                        else:
                            req, consumers = n.decode("utf-8").rsplit(":", 1)
                            done_reqs.add((req, int(consumers)))
                time.sleep(0.0005)
        except Exception as e:  # noqa: BLE001 - reported, the test fails on it
            failures.append(repr(e))

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    telemetry = []
    try:
        until(lambda: registrations or failures, "the decode side's PUSH_REG")
        until(lambda: sending or failures, "the push WRITE")
        with lock:
            handles = list(sending)
        poll_done(agent, handles, telemetry)

        # SGLang: WRITE the room's blocks and its aux row, one transfer each
        # chunk, never released
        peer = hello["sgl_name"]
        dst_base, dst_aux = hello["sgl_kv"], hello["sgl_aux"]
        src = sgl.get_xfer_descs([(sgl_kv.ctypes.data + b * BLOCK_LEN, BLOCK_LEN, 0) for b in SGL_BLOCKS], "DRAM",
                                 is_sorted=True)
        dst = sgl.get_xfer_descs([(dst_base + b * BLOCK_LEN, BLOCK_LEN, 0) for b in SGL_BLOCKS], "DRAM",
                                 is_sorted=True)
        handles = []
        for descs, notif in ((
                (src, dst), f"{SGL_ROOM}_kv_0_1"),
                ((sgl.get_xfer_descs([(aux.ctypes.data, AUX_LEN, 0)], "DRAM", is_sorted=True),
                  sgl.get_xfer_descs([(dst_aux, AUX_LEN, 0)], "DRAM", is_sorted=True)), f"{SGL_ROOM}_aux")):
            h = sgl.initialize_xfer("WRITE", descs[0], descs[1], peer, notif.encode("ascii"))
            if not h:
                raise RuntimeError("KVSender failed to create transfer")
            if sgl.transfer(h) == "ERR":
                raise RuntimeError("KVSender failed to post transfer")
            handles.append(h)
        until(lambda: all(s == "DONE" for s in [sgl.check_xfer_state(h) for h in handles]), "SGLang's WRITEs")
        del handles, h

        until(lambda: len(done_reqs) >= len(PULL_REQS) and heartbeats, "the decode side's notifications")
        send_line(f, {"pushed": True})
        recv_line(f)  # the decode side has checked everything and torn down
        stop.set()
        t.join()
        ok = (not failures and done_reqs == {(r, 1) for r in PULL_REQS}
              and heartbeats == [",".join(PULL_REQS)] and registrations[0] == 9 + 8 * 64)
        agent.release_dlist_handle(local)
        agent.release_dlist_handle(remote)
        agent.remove_remote_agent(decode_name)
        agent.deregister_memory(reg)
        sgl.remove_remote_agent(sgl_peer)
        sgl.deregister_memory(kv_descs)
        sgl.deregister_memory(aux_descs)
        report([agent, sgl], "prefill", ok, failures=failures, heartbeats=heartbeats,
               done=sorted(map(list, done_reqs)), telemetry=telemetry)
    finally:
        stop.set()
        conn.close()
        srv.close()


def decode(args):
    kv = caches(DECODE_SEED)
    agent = vllm_agent()
    reg = register(agent, kv)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", agent.get_xfer_descs(blocks_data([a.ctypes.data for a in kv]),
                                                                          "DRAM"))
    sgl = nixl_agent(str(uuid.uuid4()))
    sgl_kv = np.zeros(BLOCKS * BLOCK_LEN, np.uint8)
    sgl_aux = np.zeros(AUX_LEN, np.uint8)
    sgl_kv_descs = sgl.register_memory([(sgl_kv.ctypes.data, sgl_kv.nbytes, 0, "")], "DRAM", is_sorted=True)
    sgl_aux_descs = sgl.register_memory([(sgl_aux.ctypes.data, AUX_LEN, 0, "")], "DRAM", is_sorted=True)

    conn = socket.create_connection(("127.0.0.1", args.port))
    f = conn.makefile("rwb")
    send_line(f, {"agent_metadata": b64(agent.get_agent_metadata()), "base": [a.ctypes.data for a in kv],
                  "sgl_metadata": b64(sgl.get_agent_metadata()), "sgl_name": sgl.name,
                  "sgl_kv": sgl_kv.ctypes.data, "sgl_aux": sgl_aux.ctypes.data})
    meta = recv_line(f)
    name = agent.add_remote_agent(base64.b64decode(meta["agent_metadata"]))
    remote = agent.prep_xfer_dlist(name, agent.get_xfer_descs(blocks_data(meta["base"]), "DRAM"))

    # pull: one READ per request, local and remote block ids the same
    handles = []
    for req, ids in PULL_REQS.items():
        h = agent.make_prepped_xfer("READ", local, desc_ids(ids), remote, desc_ids(ids), notif_msg=f"{req}:1".encode())
        agent.transfer(h)
        handles.append(h)
    telemetry = []
    poll_done(agent, handles, telemetry)
    agent.send_notif(name, notif_msg=("HB:" + ",".join(PULL_REQS)).encode())
    # push: register the blocks to be written, as a binary payload (zero bytes included)
    payload = struct.pack("<64q", *(PUSH_BLOCKS + [0] * (64 - len(PUSH_BLOCKS))))
    agent.send_notif(name, notif_msg=b"PUSH_REG:" + payload)

    got = {}

    def notified():
        for who, msgs in agent.get_new_notifs().items():
            got.setdefault("vllm", []).extend((who, m) for m in msgs)
        for who, msgs in sgl.get_new_notifs().items():
            got.setdefault("sgl", []).extend((who, m) for m in msgs)
        return got.get("vllm") and len(got.get("sgl", [])) >= 2

    until(notified, "the prefill side's notifications")
    recv_line(f)
    want = caches(PREFILL_SEED)
    pulled = all(crc(block(kv[r], b)) == crc(block(want[r], b)) for ids in PULL_REQS.values() for b in ids
                 for r in range(REGIONS))
    pushed = all(crc(block(kv[r], b)) == crc(block(want[r], b)) for b in PUSH_BLOCKS for r in range(REGIONS))
    untouched = crc(block(kv[0], 31)) == crc(block(caches(DECODE_SEED)[0], 31))
    want_aux = np.random.default_rng(PREFILL_SEED + 100).integers(0, 256, AUX_LEN, dtype=np.uint8)
    sgl_ok = (all(crc(block(sgl_kv, b)) == crc(block(want[0], b)) for b in SGL_BLOCKS)
              and crc(sgl_aux) == crc(want_aux))
    sgl_notifs = sorted(m.decode("ascii") for _, m in got["sgl"])
    notif_ok = (got["vllm"] == [(name.decode() if isinstance(name, bytes) else name, b"push-req:1")]
                and sgl_notifs == [f"{SGL_ROOM}_aux", f"{SGL_ROOM}_kv_0_1"]
                and all(who == meta["sgl_name"] for who, _ in got["sgl"]))
    agent.release_dlist_handle(local)
    agent.release_dlist_handle(remote)
    agent.remove_remote_agent(name)
    agent.deregister_memory(reg)
    sgl.deregister_memory(sgl_kv_descs)
    sgl.deregister_memory(sgl_aux_descs)
    ok = pulled and pushed and untouched and sgl_ok and notif_ok
    send_line(f, {"done": True})
    conn.close()
    report([agent, sgl], "decode", ok, pulled=pulled, pushed=pushed, untouched=untouched, sgl=sgl_ok,
           notifs=notif_ok, telemetry=telemetry)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=("prefill", "decode"))
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    (prefill if args.role == "prefill" else decode)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
