"""Client-shaped programs: the way SGLang's Mooncake backend and vLLM's
NixlConnector drive the two APIs, importing ``mooncake.engine`` and
``nixl._api`` by name, so the same loop runs on tent's shims (the
tent-compat wheel) or on the real wheels. The tests run them across two
processes; a benchmark can drive them too.

The peer side runs as its own process and talks to its driver over
stdin/stdout, one JSON object per line (the application's side channel)::

    python -m tent.compat.clients mooncake-target --metadata P2PHANDSHAKE --protocol tcp
    python -m tent.compat.clients nixl-peer --layers 2 --blocks 32 --block-size 16384

Both print ``{"ready": ...}`` first, then answer commands (``crc``,
``wait_notif``, ``quit``) until ``quit``, after which they print what
they held at teardown (``leaks``) and the process's live tent handles
once everything was released (``process_handles``: 0 when clean).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence

LEAK_COUNTS = ("regions", "registered_bytes", "handles", "segments", "batches", "requests_in_flight",
               "allocations")


def leaks(engine: Any) -> Dict[str, int]:
    """The non-zero resource counts of a tent.Engine."""
    s = engine.stats()
    return {k: s[k] for k in LEAK_COUNTS if s.get(k)}


def leaks_besides_segments(engine: Any) -> Dict[str, int]:
    """leaks(), not counting open peer segments (Mooncake caches one per
    peer until close(); they count as handles too)."""
    held = leaks(engine)
    n = held.pop("segments", 0)
    if n and held.get("handles", 0) >= n:
        held["handles"] -= n
        if not held["handles"]:
            del held["handles"]
    return held


def live_process_handles() -> int:
    """Live tent handles of every engine in this process, not counting the
    probe engine that asks (0 once everything was released)."""
    import tent

    with tent.Engine() as probe:
        return int(probe.stats()["process_handles"]) - 1


def kv_layers(layers: int, blocks: int, block_size: int, seed: Optional[int]) -> List[Any]:
    """One uint8 array per layer: zeros, or bytes from seed (reproducible)."""
    import numpy as np

    if seed is None:
        return [np.zeros(blocks * block_size, dtype=np.uint8) for _ in range(layers)]
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, blocks * block_size, dtype=np.uint8) for _ in range(layers)]


def crcs(arrays: Sequence[Any]) -> List[int]:
    return [zlib.crc32(memoryview(a)) for a in arrays]


def _emit(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _commands() -> Any:
    for line in sys.stdin:
        line = line.strip()
        if line:
            yield json.loads(line)


# ---- Mooncake: SGLang-shaped ---------------------------------------------------


def mooncake_session(engine: Any, hostname: str, metadata: str) -> str:
    """The session id SGLang hands its peers: host:rpc_port with
    P2PHANDSHAKE, the local hostname with a metadata server."""
    if metadata == "P2PHANDSHAKE":
        return f"{hostname.rsplit(':', 1)[0] if hostname.count(':') == 1 else hostname}:{engine.get_rpc_port()}"
    return hostname


def mooncake_target(args: argparse.Namespace) -> int:
    """The receiving side (a decode instance's KV buffers)."""
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    rc = engine.initialize(args.hostname, args.metadata, args.protocol, "")
    if rc != 0:
        _emit({"ready": False, "rc": rc})
        return 1
    kv = kv_layers(args.layers, args.blocks, args.block_size, None)
    ptrs = [int(a.ctypes.data) for a in kv]
    lens = [int(a.nbytes) for a in kv]
    rc = engine.batch_register_memory(ptrs, lens)
    _emit({"ready": rc == 0, "rc": rc, "session": mooncake_session(engine, args.hostname, args.metadata),
           "ptrs": ptrs, "lens": lens, "pid": os.getpid()})
    for cmd in _commands():
        op = cmd.get("cmd")
        if op == "crc":
            _emit({"crc": crcs(kv)})
        elif op == "notifies":
            deadline = time.monotonic() + float(cmd.get("timeout", 10))
            got: List[Dict[str, str]] = []
            while time.monotonic() < deadline and len(got) < int(cmd.get("count", 1)):
                got += [{"name": n.name, "msg": n.msg} for n in engine.get_notifies()]
                time.sleep(0.005)
            _emit({"notifies": got, "crc": crcs(kv)})
        elif op == "quit":
            rc = engine.batch_unregister_memory(ptrs)
            tent_engine = engine.get_engine()
            held = leaks_besides_segments(tent_engine) if hasattr(tent_engine, "stats") else {}
            close = getattr(engine, "close", None)
            if close is not None:
                close()
            _emit({"bye": True, "rc": rc, "leaks": held,
                   "process_handles": live_process_handles() if close is not None else None})
            return 0
    return 0


class MooncakeInitiator:
    """The sending side the way SGLang drives it: registered KV buffers, a
    thread pool issuing batch_transfer_sync_write per layer."""

    def __init__(self, hostname: str, metadata: str, protocol: str, layers: int, blocks: int, block_size: int,
                 seed: int = 1) -> None:
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        rc = self.engine.initialize(hostname, metadata, protocol, "")
        if rc != 0:
            raise RuntimeError(f"initialize returned {rc}")
        self.block_size = block_size
        self.kv = kv_layers(layers, blocks, block_size, seed)
        self.ptrs = [int(a.ctypes.data) for a in self.kv]
        rc = self.engine.batch_register_memory(self.ptrs, [int(a.nbytes) for a in self.kv])
        if rc != 0:
            raise RuntimeError(f"batch_register_memory returned {rc}")
        self.pool = ThreadPoolExecutor(max_workers=min(8, layers))

    def send(self, session: str, peer_ptrs: Sequence[int], block_ids: Sequence[int]) -> List[int]:
        """Writes the blocks of every layer (one batch per layer, in the
        pool); returns each batch's code."""
        bs = self.block_size

        def layer(i: int) -> int:
            src = [self.ptrs[i] + b * bs for b in block_ids]
            dst = [peer_ptrs[i] + b * bs for b in block_ids]
            return int(self.engine.batch_transfer_sync_write(session, src, dst, [bs] * len(block_ids)))

        return list(self.pool.map(layer, range(len(self.ptrs))))

    def close(self) -> Dict[str, Any]:
        """Unregisters and releases; what was held and the live handles after."""
        self.pool.shutdown()
        rc = self.engine.batch_unregister_memory(self.ptrs)
        held = leaks_besides_segments(self.engine.get_engine())
        self.engine.close()
        return {"rc": rc, "leaks": held, "process_handles": live_process_handles()}


# ---- NIXL: vLLM-NixlConnector-shaped --------------------------------------------


def nixl_block_descs(bases: Sequence[int], blocks: int, block_len: int) -> List[Any]:
    """One (addr, len, dev) per block per layer, layer-major (vLLM's
    layout: descriptor id = layer * blocks + block)."""
    return [(base + b * block_len, block_len, 0) for base in bases for b in range(blocks)]


def nixl_peer(args: argparse.Namespace) -> int:
    """A prefill-side agent: registers its KV caches, hands out its
    metadata, then answers notifications (verifying its own data at the
    moment a notification arrives: the data must already be there)."""
    from nixl._api import nixl_agent, nixl_agent_config

    config = nixl_agent_config(backends=["UCX"], enable_listen_thread=args.listen,
                               listen_port=args.listen_port)
    agent = nixl_agent(args.name or str(uuid.uuid4()), config)
    kv = kv_layers(args.layers, args.blocks, args.block_size, args.seed)
    caches_data = [(int(a.ctypes.data), int(a.nbytes), 0, "") for a in kv]
    descs = agent.get_reg_descs(caches_data, "DRAM")
    agent.register_memory(descs)
    if args.etcd:
        agent.send_local_metadata()
    _emit({"ready": True, "agent": agent.name, "metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
           "bases": [d[0] for d in caches_data], "block_len": args.block_size, "blocks": args.blocks,
           "listen_port": getattr(agent, "listen_port", args.listen_port), "pid": os.getpid()})
    pending: Dict[str, List[bytes]] = {}
    for cmd in _commands():
        op = cmd.get("cmd")
        if op == "crc":
            _emit({"crc": crcs(kv)})
        elif op == "wait_notif":
            want = cmd["msg"].encode()
            deadline = time.monotonic() + float(cmd.get("timeout", 10))
            found = None
            while found is None and time.monotonic() < deadline:
                for sender, msgs in agent.get_new_notifs().items():
                    pending.setdefault(sender, []).extend(msgs)
                for sender, msgs in pending.items():
                    if want in msgs:
                        msgs.remove(want)
                        found = sender
                        break
                if found is None:
                    time.sleep(0.002)
            _emit({"notif_from": found, "crc": crcs(kv)})  # crc taken at notification time
        elif op == "send_notif":
            agent.add_remote_agent(base64.b64decode(cmd["metadata"]))
            agent.send_notif(cmd["agent"], cmd["msg"].encode())
            _emit({"sent": True})
        elif op == "quit":
            if args.etcd:
                agent.invalidate_local_metadata()
            agent.deregister_memory(descs)
            for name in list(getattr(agent, "_remotes", {})):
                agent.remove_remote_agent(name)
            engine = getattr(agent, "tent_engine", None)
            held = leaks(engine) if engine is not None else {}
            close = getattr(agent, "close", None)
            if close is not None:
                close()
            _emit({"bye": True, "leaks": held,
                   "process_handles": live_process_handles() if close is not None else None})
            return 0
    return 0


class NixlDecoder:
    """The decode side the way vLLM's NixlConnector drives it: KV caches
    registered, a peer's metadata added, local and remote dlists prepared
    once, then READs by block ids with a notification."""

    def __init__(self, layers: int, blocks: int, block_size: int, telemetry: bool = True) -> None:
        from nixl._api import nixl_agent, nixl_agent_config

        self.agent = nixl_agent(str(uuid.uuid4()), nixl_agent_config(backends=["UCX"], capture_telemetry=telemetry))
        self.blocks, self.block_len = blocks, block_size
        self.kv = kv_layers(layers, blocks, block_size, None)
        caches_data = [(int(a.ctypes.data), int(a.nbytes), 0, "") for a in self.kv]
        self.reg_descs = self.agent.get_reg_descs(caches_data, "DRAM")
        self.agent.register_memory(self.reg_descs)
        local = self.agent.get_xfer_descs(nixl_block_descs([d[0] for d in caches_data], blocks, block_size), "DRAM")
        self.local_handle = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", local)
        self.remote_handles: Dict[str, Any] = {}

    def add_peer(self, ready: Dict[str, Any]) -> str:
        """add_remote_agent with the metadata from the side channel, then the
        remote dlist of the peer's blocks."""
        name = self.agent.add_remote_agent(base64.b64decode(ready["metadata"]))
        self.prep_remote(name, ready)
        return name

    def prep_remote(self, name: str, ready: Dict[str, Any]) -> None:
        remote = self.agent.get_xfer_descs(nixl_block_descs(ready["bases"], self.blocks, self.block_len), "DRAM")
        self.remote_handles[name] = self.agent.prep_xfer_dlist(name, remote)

    def desc_ids(self, block_ids: Sequence[int]) -> List[int]:
        return [layer * self.blocks + b for layer in range(len(self.kv)) for b in block_ids]

    def read_blocks(self, peer: str, block_ids: Sequence[int], notif: bytes, timeout: float = 30.0,
                    op: str = "READ") -> Any:
        """One transfer of the blocks, polled until DONE; returns its
        telemetry. Raises what check_xfer_state raises, or TimeoutError."""
        ids = self.desc_ids(block_ids)
        handle = self.agent.make_prepped_xfer(op, self.local_handle, ids, self.remote_handles[peer], ids,
                                              notif_msg=notif)
        try:
            state = self.agent.transfer(handle)
            deadline = time.monotonic() + timeout
            while state != "DONE":
                if state not in ("PROC", "DONE"):
                    raise RuntimeError(f"transfer state {state}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"still {state} after {timeout} s")
                time.sleep(0.0005)
                state = self.agent.check_xfer_state(handle)
            return self.agent.get_xfer_telemetry(handle)
        finally:
            self.agent.release_xfer_handle(handle)

    def close(self) -> Dict[str, Any]:
        for h in self.remote_handles.values():
            self.agent.release_dlist_handle(h)
        self.agent.release_dlist_handle(self.local_handle)
        for name in list(self.remote_handles):
            self.agent.remove_remote_agent(name)
        self.remote_handles.clear()
        self.agent.deregister_memory(self.reg_descs)
        held = leaks(self.agent.tent_engine)
        self.agent.close()
        return {"leaks": held, "process_handles": live_process_handles()}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tent.compat.clients")
    sub = p.add_subparsers(dest="role", required=True)
    m = sub.add_parser("mooncake-target")
    m.add_argument("--hostname", default="127.0.0.1")
    m.add_argument("--metadata", default="P2PHANDSHAKE")
    m.add_argument("--protocol", default="rdma")
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--blocks", type=int, default=64)
    m.add_argument("--block-size", type=int, default=16384)
    n = sub.add_parser("nixl-peer")
    n.add_argument("--name", default="")
    n.add_argument("--layers", type=int, default=2)
    n.add_argument("--blocks", type=int, default=32)
    n.add_argument("--block-size", type=int, default=16384)
    n.add_argument("--seed", type=int, default=7)
    n.add_argument("--listen", action="store_true", help="enable_listen_thread")
    n.add_argument("--listen-port", type=int, default=0)
    n.add_argument("--etcd", action="store_true", help="publish metadata in etcd (NIXL_ETCD_ENDPOINTS)")
    args = p.parse_args(argv)
    return mooncake_target(args) if args.role == "mooncake-target" else nixl_peer(args)


if __name__ == "__main__":
    sys.exit(main())
