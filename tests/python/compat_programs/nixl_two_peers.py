"""A program written against NIXL's Python API the way NIXL's own two-peer
example is: a target and an initiator, each its own process, metadata over
the target's listen thread, the target's descriptors sent in a
notification, READs by descriptor index (prep_xfer_dlist +
make_prepped_xfer, remote indices reversed), WRITEs from tuple lists and
Nx3 numpy arrays (initialize_xfer), both posted in parallel and polled,
the READs reposted with new notifications, then teardown.

Memory is numpy (rows of random bytes from a seed) instead of torch
tensors; both sides know the expected final contents from the seeds and
check them with crc32. It imports only ``nixl`` by name; the last stdout
line is a JSON report (with tent's leak counts when it runs on tent).

    python nixl_two_peers.py --mode target --ip 127.0.0.1 --port 0   # NIXL_LOG_LEVEL=INFO prints the port
    python nixl_two_peers.py --mode initiator --ip 127.0.0.1 --port PORT
"""

import argparse
import base64
import json
import sys
import time
import zlib

import numpy as np

from nixl._api import nixl_agent, nixl_agent_config
from nixl.logging import get_logger

logger = get_logger(__name__)

ROWS, ROW_BYTES = 16, 4096
READ_GROUPS = [[s, s + 4, s + 8] for s in range(4)]  # rows 0..11, remote ids reversed per group
WRITE_ROWS = {12: 0, 13: ROW_BYTES // 2, 14: 0, 15: ROW_BYTES // 2}  # row -> offset of the half written
HALF = ROW_BYTES // 2
TIMEOUT_S = 60.0


def rows(seed):
    return np.random.default_rng(seed).integers(0, 256, (ROWS, ROW_BYTES), dtype=np.uint8)


def expected(target_seed, initiator_seed):
    """(the target's rows, the initiator's rows) once everything ran."""
    t, i = rows(target_seed), rows(initiator_seed)
    for r, off in WRITE_ROWS.items():
        t[r, off:off + HALF] = i[r, off:off + HALF]
    for group in READ_GROUPS:
        for local, remote in zip(group, group[::-1]):
            i[local] = t[remote]
    return t, i


def crc(a):
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def until(cond, what):
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.001)


def report(agent, mode, ok, **extra):
    out = {"mode": mode, "ok": ok, **extra}
    engine = getattr(agent, "tent_engine", None)  # tent's counts, when the agent runs on tent
    if engine is not None:
        s = engine.stats()
        # what is still held before the agent goes: open peer connections
        # (a segment, and its handle) apart, which an agent keeps for peers
        # it did not remove (NIXL's target never removes its initiator).
        # A connection the peer is closing right now can have given its
        # handle back before its segment is counted out (fewer handles than
        # segments for a moment): only more handles than segments is held.
        keys = ("regions", "registered_bytes", "handles", "batches", "requests_in_flight")
        held = {k: s[k] - (s["segments"] if k == "handles" else 0) for k in keys}
        out["leaks"] = {k: v for k, v in held.items() if v > 0 or (v and k != "handles")}
        out["segments"] = s["segments"]
        out["moved"] = {t: v.get("bytes", 0) + v.get("bytes_sent", 0) + v.get("bytes_received", 0)
                        for t, v in s["transports"].items()}
        agent.close()
        import tent

        with tent.Engine() as probe:
            out["process_handles"] = int(probe.stats()["process_handles"]) - 1
    print(json.dumps(out), flush=True)


def target(args):
    agent = nixl_agent("target", nixl_agent_config(True, True, args.port))
    mem = rows(args.target_seed)
    reg = agent.register_memory([(mem.ctypes.data, mem.nbytes, 0, "")], "DRAM")
    xfer = agent.get_xfer_descs(
        np.array([[mem[r].ctypes.data, ROW_BYTES, 0] for r in range(ROWS)], dtype=np.uint64), "DRAM")
    layout = {"base": mem.ctypes.data, "rows": ROWS, "row_bytes": ROW_BYTES,
              "descs": base64.b64encode(agent.get_serialized_descs(xfer)).decode()}
    until(lambda: agent.check_remote_metadata("initiator"), "the initiator's metadata")
    agent.send_notif("initiator", json.dumps(layout).encode())

    want_reads = {f"Read idx {','.join(map(str, g))}".encode() for g in READ_GROUPS}
    want_reads |= {m + b" again" for m in want_reads}
    writes = 0

    def all_in():
        nonlocal writes
        for msg in agent.get_new_notifs().get("initiator", []):
            if msg in want_reads:
                want_reads.discard(msg)
            elif msg.startswith(b"Write"):
                writes += 1
        return not want_reads and writes == 2

    until(all_in, "the initiator's notifications")
    want, _ = expected(args.target_seed, args.initiator_seed)
    ok = crc(mem) == crc(want)
    agent.deregister_memory(reg)
    report(agent, "target", ok, crc=crc(mem))
    return 0 if ok else 1


def initiator(args):
    agent = nixl_agent("initiator", nixl_agent_config(True, True, 0))
    mem = rows(args.initiator_seed)
    reg = agent.register_memory([(mem.ctypes.data, mem.nbytes, 0, "")], "DRAM")
    agent.send_local_metadata(args.ip, args.port)
    agent.fetch_remote_metadata("target", args.ip, args.port)
    notifs = until(lambda: agent.get_new_notifs(), "the target's layout")
    layout = json.loads(notifs["target"][0])
    remote_descs = agent.deserialize_descs(base64.b64decode(layout["descs"]))
    until(lambda: agent.check_remote_metadata("target"), "the target's metadata")

    local_descs = agent.get_xfer_descs([(mem[r].ctypes.data, ROW_BYTES, 0) for r in range(ROWS)], "DRAM")
    local_side = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local_descs)
    remote_side = agent.prep_xfer_dlist("target", remote_descs)
    reads = [agent.make_prepped_xfer("READ", local_side, g, remote_side, g[::-1],
                                     f"Read idx {','.join(map(str, g))}".encode()) for g in READ_GROUPS]

    base = layout["base"]
    w0 = [(mem[r].ctypes.data + WRITE_ROWS[r], HALF, 0) for r in (12, 13)]
    r0 = [(base + r * ROW_BYTES + WRITE_ROWS[r], HALF, 0) for r in (12, 13)]
    w1 = np.array([[mem[r].ctypes.data + WRITE_ROWS[r], HALF, 0] for r in (14, 15)], dtype=np.uint64)
    r1 = np.array([[base + r * ROW_BYTES + WRITE_ROWS[r], HALF, 0] for r in (14, 15)], dtype=np.uint64)
    writes = [agent.initialize_xfer("WRITE", agent.get_xfer_descs(w0, mem_type="cpu"),
                                    agent.get_xfer_descs(r0, mem_type="cpu"), "target", b"Write rows 12,13"),
              agent.initialize_xfer("WRITE", agent.get_xfer_descs(w1, "DRAM"),
                                    agent.get_xfer_descs(r1, "DRAM"), "target", "Write rows 14,15")]

    def run(handles, notifs=None):
        for k, h in enumerate(handles):
            state = agent.transfer(h, notifs[k]) if notifs else agent.transfer(h)
            if state == "ERR":
                raise RuntimeError("posting failed")
        pending = list(handles)
        deadline = time.monotonic() + TIMEOUT_S
        while pending:
            for h in list(pending):
                state = agent.check_xfer_state(h)
                if state == "ERR":
                    raise RuntimeError("a transfer failed")
                if state == "DONE":
                    pending.remove(h)
            if time.monotonic() > deadline:
                raise TimeoutError("transfers still running")

    # WRITEs first (they read the initiator's own rows 12..15, untouched by the READs)
    run(writes)
    run(reads)
    run(reads, [f"Read idx {','.join(map(str, g))} again".encode() for g in READ_GROUPS])

    _, want = expected(args.target_seed, args.initiator_seed)
    ok = crc(mem) == crc(want)
    agent.remove_remote_agent("target")
    for h in reads + writes:
        agent.release_xfer_handle(h)
    agent.release_dlist_handle(local_side)
    agent.release_dlist_handle(remote_side)
    agent.invalidate_local_metadata(args.ip, args.port)
    agent.deregister_memory(reg)
    report(agent, "initiator", ok, crc=crc(mem))
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["target", "initiator"], default="initiator")
    p.add_argument("--ip", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5555)
    p.add_argument("--target-seed", type=int, default=1)
    p.add_argument("--initiator-seed", type=int, default=2)
    args = p.parse_args()
    return target(args) if args.mode == "target" else initiator(args)


if __name__ == "__main__":
    sys.exit(main())
