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


class Peer:
    """``python -m tent.compat.clients <role> ...`` as a child process,
    driven over its stdin/stdout (one JSON object per line)."""

    def __init__(self, role: str, args: Sequence[Any] = (), env: Optional[Dict[str, str]] = None,
                 timeout: float = 30.0) -> None:
        import subprocess

        full_env = dict(os.environ)
        full_env.update(env or {})
        self.timeout = timeout
        self.proc = subprocess.Popen([sys.executable, "-m", "tent.compat.clients", role, *map(str, args)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=full_env)
        self.ready = self.read()
        if not self.ready.get("ready"):
            raise RuntimeError(f"{role} did not start: {self.ready} {self.stderr()}")

    def read(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        import select

        assert self.proc.stdout is not None
        limit = timeout or self.timeout
        deadline = time.monotonic() + limit
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the peer within {limit} s: {self.stderr()}")
            if select.select([self.proc.stdout], [], [], left)[0]:
                line = self.proc.stdout.readline()
                if not line:
                    raise EOFError(f"the peer exited ({self.proc.poll()}): {self.stderr()}")
                if not line.startswith("{"):
                    continue  # a library's log line (NIXL logs on stdout)
                return dict(json.loads(line))

    def call(self, cmd: str, timeout: Optional[float] = None, **kw: Any) -> Dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def quit(self) -> Dict[str, Any]:
        bye = self.call("quit")
        self.proc.wait(timeout=self.timeout)
        return bye

    def kill(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=self.timeout)

    def stderr(self) -> str:
        """The peer's stderr so far (without blocking), for messages."""
        import select

        err = self.proc.stderr
        if err is None or not select.select([err], [], [], 0)[0]:
            return ""
        return os.read(err.fileno(), 1 << 16).decode("utf-8", "replace")[-2000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=self.timeout)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


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
           "listen_port": getattr(agent, "listen_port", args.listen_port), "pid": os.getpid(),
           "tent_address": agent.tent_engine.name if hasattr(agent, "tent_engine") else None})
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


# ---- what the compat layer costs ---------------------------------------------------


def overhead(transport: str = "shm", block_size: int = 65536, batch: int = 128, iters: int = 50,
             rounds: int = 8) -> Dict[str, Any]:
    """Microseconds per batch of `batch` x `block_size` WRITEs to a peer
    process: tent's own call (a prebuilt request array, ``Engine.transfer``
    and ``wait``) beside the same batch through Mooncake's
    ``batch_transfer_sync_write`` and through NIXL's ``make_prepped_xfer`` /
    ``transfer`` / ``check_xfer_state`` / ``release_xfer_handle``, on the
    same engine and memory, interleaved round by round in alternating
    order; the best round of each (least disturbed by other load) and the
    median. Beside Mooncake's, tent's waiting call (``tent_transfer_sync``)
    of the same array, which is what ``batch_transfer_sync_write`` calls
    (as columns): ``mooncake_added_percent_over_sync``."""
    import ctypes
    import statistics

    from tent import _lib
    from tent._errors import check

    env = {"TENT_COMPAT_TRANSPORTS": transport}
    saved = os.environ.get("TENT_COMPAT_TRANSPORTS")
    os.environ["TENT_COMPAT_TRANSPORTS"] = transport

    def timed(fs: Dict[str, Any]) -> Dict[str, List[float]]:
        for f in fs.values():
            for _ in range(max(5, iters // 4)):
                f()
        runs: Dict[str, List[float]] = {k: [] for k in fs}
        order = list(fs.items())
        for r in range(rounds):
            # alternate the order round by round: the call timed first in a
            # round runs cache-cold (measured 10-20% slower), and a fixed
            # order would charge that to one side
            for k, f in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                for _ in range(iters):
                    f()
                runs[k].append((time.perf_counter() - t0) / iters * 1e6)
        return runs

    out: Dict[str, Any] = {"transport": transport, "block_size": block_size, "batch": batch}
    runs: Dict[str, List[float]] = {}
    try:
        target = Peer("mooncake-target", ["--protocol", transport, "--layers", 1, "--blocks", batch,
                                          "--block-size", block_size], env)
        init = MooncakeInitiator("127.0.0.1", "P2PHANDSHAKE", transport, 1, batch, block_size)
        try:
            session, dst = target.ready["session"], target.ready["ptrs"][0]
            engine = init.engine.get_engine()
            srcs = [init.ptrs[0] + i * block_size for i in range(batch)]
            dsts = [dst + i * block_size for i in range(batch)]
            lens = [block_size] * batch
            seg = engine.open_segment(session)
            reqs = tent_requests(seg, srcs, dsts, lens)

            def native() -> None:
                with engine.transfer(reqs) as b:
                    b.wait()

            # tent_transfer_sync of the same request array: the waiting
            # call batch_transfer_sync_write's own is (tent_transfer_columns_sync),
            # which may copy on the calling thread; Python has no multi-request
            # sync call, so it is called as tent.compat calls tent.
            sync_args = (engine._handle_arg, (_lib.Request * batch).from_buffer(reqs), ctypes.c_size_t(batch),
                         None, None)

            def native_sync() -> None:
                st = engine._fast.tent_transfer_sync(*sync_args)
                if st < 0:
                    check(st)

            def mooncake() -> None:
                if init.engine.batch_transfer_sync_write(session, srcs, dsts, lens) != 0:
                    raise RuntimeError(init.engine.last_error)

            r = timed({"tent": native, "tent sync": native_sync, "mooncake": mooncake})
            runs["tent (mooncake peer)"], runs["mooncake"] = r["tent"], r["mooncake"]
            runs["tent sync (mooncake peer)"] = r["tent sync"]
            seg.close()
        finally:
            init.close()
            target.quit()
            target.close()
        peer = Peer("nixl-peer", ["--layers", 1, "--blocks", batch, "--block-size", block_size], env)
        dec = NixlDecoder(1, batch, block_size, telemetry=False)
        try:
            name = dec.add_peer(peer.ready)
            agent, ids = dec.agent, list(range(batch))
            engine = agent.tent_engine
            seg = engine.open_segment(peer.ready["tent_address"])
            base = int(dec.kv[0].ctypes.data)
            reqs = tent_requests(seg, [base + i * block_size for i in range(batch)],
                                 [peer.ready["bases"][0] + i * block_size for i in range(batch)],
                                 [block_size] * batch)

            def native2() -> None:
                with engine.transfer(reqs) as b:
                    b.wait()

            def nixl() -> None:
                h = agent.make_prepped_xfer("WRITE", dec.local_handle, ids, dec.remote_handles[name], ids)
                agent.transfer(h)
                while agent.check_xfer_state(h) != "DONE":
                    pass
                agent.release_xfer_handle(h)

            r = timed({"tent": native2, "nixl": nixl})
            runs["tent (nixl peer)"], runs["nixl"] = r["tent"], r["nixl"]
            seg.close()
        finally:
            dec.close()
            peer.quit()
            peer.close()
    finally:
        if saved is None:
            os.environ.pop("TENT_COMPAT_TRANSPORTS", None)
        else:
            os.environ["TENT_COMPAT_TRANSPORTS"] = saved
    out["us_per_batch"] = {k: {"best": round(min(v), 1), "median": round(statistics.median(v), 1)}
                           for k, v in runs.items()}
    for api, ref in (("mooncake", "tent (mooncake peer)"), ("nixl", "tent (nixl peer)")):
        out[f"{api}_added_percent"] = round((min(runs[api]) / min(runs[ref]) - 1) * 100, 1)
    out["mooncake_added_percent_over_sync"] = round(
        (min(runs["mooncake"]) / min(runs["tent sync (mooncake peer)"]) - 1) * 100, 1)
    return out


def tent_requests(seg: Any, srcs: Sequence[int], dsts: Sequence[int], lens: Sequence[int]) -> Any:
    """A request array the way a tent client builds one (tent.make_requests)."""
    import numpy as np

    import tent

    base = int(srcs[0])
    return tent.make_requests("write", base, seg, int(dsts[0]),
                              local_offsets=np.asarray(srcs, dtype=np.uint64) - np.uint64(base),
                              remote_offsets=np.asarray(dsts, dtype=np.uint64) - np.uint64(dsts[0]),
                              lengths=np.asarray(lens, dtype=np.uint64))


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
    o = sub.add_parser("overhead", help="what the Mooncake and NIXL calls add to tent's own (JSON)")
    o.add_argument("--transport", default="shm")
    o.add_argument("--block-size", type=int, default=65536)
    o.add_argument("--batch", type=int, default=128)
    o.add_argument("--iters", type=int, default=50)
    o.add_argument("--rounds", type=int, default=8)
    args = p.parse_args(argv)
    # stdout carries this program's JSON lines: the "nixl" logger (which
    # NIXL, and so tent's nixl, points at stdout) writes to stderr instead
    import logging

    logging.getLogger("nixl").addHandler(logging.StreamHandler(sys.stderr))
    if args.role == "overhead":
        print(json.dumps(overhead(args.transport, args.block_size, args.batch, args.iters, args.rounds)))
        return 0
    return mooncake_target(args) if args.role == "mooncake-target" else nixl_peer(args)


if __name__ == "__main__":
    sys.exit(main())
