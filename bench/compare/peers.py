"""The comparison's workload on Mooncake's transfer engine and on NIXL.

    python bench/compare/peers.py --engine mooncake|nixl [--on-tent] [--block-size 4K-64M] [--op write,read]
        [--batch 128] [--duration 2] [--span 256M] [--json FILE] [--check]

Runs in bench/compare/.venv-peers (the peers and the tent wheel installed
there: it borrows the sweep's (bench/sweep/sweep.py) layout, statistics, fill pattern and
CRC-32, so every engine runs exactly the same loop as the sweep):
two processes on this machine (this one the initiator, a spawned
`--role target`), DRAM -> DRAM, one batch of --batch requests of one block
size at a time, submit-and-wait, timed per batch, for --duration seconds
per point (at least one batch), after an untimed warm-up of at most
64 MiB. A batch's requests cover batch x block bytes wrapping within
--span bytes, at equal local and remote offsets.

- mooncake: `mooncake.engine.TransferEngine`, initialize(host, "P2PHANDSHAKE",
  "tcp", ""), register_memory on an anonymous mapping, and
  batch_transfer_sync_write / batch_transfer_sync_read to "127.0.0.1:<rpc port>".
  MC_USE_TENT=1 in the environment asks for its TENT backend.
- nixl: `nixl._api.nixl_agent` with the UCX backend, "DRAM" registrations,
  metadata exchanged over this script's control pipe (get_agent_metadata /
  add_remote_agent), a prepared transfer (prep_xfer_dlist for both sides,
  make_prepped_xfer once per point: NIXL's fastest documented path), then per
  batch transfer() and check_xfer_state() polled until DONE. UCX picks its
  transports (UCX_TLS; UCX_NET_DEVICES=lo keeps TCP on loopback); with
  UCX_PROTO_INFO=y UCX prints which one it chose.

The control channel to the target is a pair of pipes on fds given on the
command line (the libraries print on stdout). Output: the same JSON lines as
the sweep ("meta", "point"/"error" records, "summary"), each with "engine".

--on-tent runs the same client code (every call above, unchanged) against
tent's drop-in APIs instead of the wheels: `tent.compat.mooncake` and
`tent.compat.nixl` (what the tent-compat wheel installs as `mooncake.engine`
and `nixl`). Mooncake's "tcp" protocol is tent's tcp transport; NIXL's UCX
backend is served by tent's best transport for the peer (shm on one host).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import mmap
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sweep"))
# bench/sweep/sweep.py, beside this folder
from sweep import (LAYOUTS, covered, crc, fill, layout, loadavg, machine, parse_ops, parse_size,  # noqa: E402
                   parse_sizes, percentiles)


class Mapping:
    def __init__(self, size: int) -> None:
        self.size = size
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        fill(self.addr, size, 0)


# ---- engines ------------------------------------------------------------------------------


class Mooncake:
    name = "mooncake"

    def __init__(self, mem: Mapping, on_tent: bool) -> None:
        if on_tent:
            from tent.compat.mooncake import TransferEngine
        else:
            from mooncake.engine import TransferEngine

        self.mem = mem
        self.e = TransferEngine()
        rc = self.e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"TransferEngine.initialize returned {rc}")
        rc = self.e.register_memory(mem.addr, mem.size, "cpu:0")
        if rc != 0:
            raise RuntimeError(f"TransferEngine.register_memory returned {rc}")

    def info(self) -> Dict[str, Any]:
        return {"name": f"127.0.0.1:{self.e.get_rpc_port()}", "addr": self.mem.addr}

    def connect(self, info: Dict[str, Any]) -> None:
        self.peer, self.remote = info["name"], info["addr"]

    def prepare(self, op: str, offs: List[int], block: int) -> Any:
        loc = [self.mem.addr + o for o in offs]
        rem = [self.remote + o for o in offs]
        lens = [block] * len(offs)
        fn = self.e.batch_transfer_sync_write if op == "WRITE" else self.e.batch_transfer_sync_read
        return (fn, loc, rem, lens)

    def run(self, prepared: Any) -> None:
        fn, loc, rem, lens = prepared
        rc = fn(self.peer, loc, rem, lens)
        if rc != 0:
            raise RuntimeError(f"{fn.__name__} returned {rc}")

    def release(self, prepared: Any) -> None:
        pass

    def close(self) -> None:
        self.e.unregister_memory(self.mem.addr)


class Nixl:
    name = "nixl"

    def __init__(self, mem: Mapping, agent_name: str, on_tent: bool) -> None:
        if on_tent:
            from tent.compat.nixl._api import nixl_agent, nixl_agent_config
        else:
            from nixl._api import nixl_agent, nixl_agent_config

        self.mem = mem
        self.agent = nixl_agent(agent_name, nixl_agent_config(backends=["UCX"]))
        self.reg = self.agent.register_memory([(mem.addr, mem.size, 0, "")], "DRAM")
        if self.reg is None:
            raise RuntimeError("nixl register_memory returned None")

    def info(self) -> Dict[str, Any]:
        return {"md": base64.b64encode(self.agent.get_agent_metadata()).decode(), "addr": self.mem.addr}

    def connect(self, info: Dict[str, Any]) -> None:
        self.peer = self.agent.add_remote_agent(base64.b64decode(info["md"]))
        self.remote = info["addr"]

    def prepare(self, op: str, offs: List[int], block: int) -> Any:
        a = self.agent
        loc = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(self.mem.addr + o, block, 0) for o in offs], "DRAM")
        rem = a.prep_xfer_dlist(self.peer, [(self.remote + o, block, 0) for o in offs], "DRAM")
        idx = list(range(len(offs)))
        h = a.make_prepped_xfer(op, loc, idx, rem, idx)
        if h is None:
            raise RuntimeError("nixl make_prepped_xfer returned None")
        return (h, loc, rem)

    def run(self, prepared: Any) -> None:
        h = prepared[0]
        a = self.agent
        s = a.transfer(h)
        while s == "PROC":
            s = a.check_xfer_state(h)
        if s != "DONE":
            raise RuntimeError(f"nixl transfer state {s}")

    def release(self, prepared: Any) -> None:
        for x in prepared:
            x.release()

    def close(self) -> None:
        self.agent.deregister_memory(self.reg)


def make_engine(kind: str, mem: Mapping, role: str, on_tent: bool = False) -> Any:
    if kind == "mooncake":
        return Mooncake(mem, on_tent)
    if kind == "nixl":
        return Nixl(mem, f"{role}-{os.getpid()}", on_tent)
    raise SystemExit(f"unknown engine {kind!r}")


# ---- target -------------------------------------------------------------------------------


def target_main(args: argparse.Namespace) -> int:
    cin = os.fdopen(args.ctl_in, "r")
    cout = os.fdopen(args.ctl_out, "w")
    mem = Mapping(args.span)
    eng = make_engine(args.engine, mem, "target", args.on_tent)
    cout.write(json.dumps(eng.info()) + "\n")
    cout.flush()
    for line in cin:
        cmd = json.loads(line)
        c = cmd["cmd"]
        if c == "fill":
            fill(mem.addr, cmd["len"], cmd["seed"])
            reply: Dict[str, Any] = {"crc": crc(mem.addr, cmd["len"])}
        elif c == "crc":
            reply = {"crc": crc(mem.addr, cmd["len"])}
        elif c == "quit":
            cout.write("{}\n")
            cout.flush()
            break
        else:
            reply = {"error": f"unknown command {c}"}
        cout.write(json.dumps(reply) + "\n")
        cout.flush()
    eng.close()
    return 0


class Target:
    def __init__(self, args: argparse.Namespace) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        cmd = [sys.executable, os.path.abspath(__file__), "--role", "target", "--engine", args.engine,
               "--span", str(args.span), *(["--on-tent"] if args.on_tent else []), "--ctl-in", str(to_child_r), "--ctl-out", str(from_child_w)]
        self.proc = subprocess.Popen(cmd, pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                                     stdout=sys.stderr)
        os.close(to_child_r)
        os.close(from_child_w)
        self.w = os.fdopen(to_child_w, "w")
        self.r = os.fdopen(from_child_r, "r")
        self.info = self._read()

    def _read(self) -> Dict[str, Any]:
        line = self.r.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"the target exited{self.exit_note()}")
        return json.loads(line)

    def call(self, **cmd: Any) -> Dict[str, Any]:
        self.w.write(json.dumps(cmd) + "\n")
        self.w.flush()
        return self._read()

    def exit_note(self) -> str:
        rc = self.proc.poll()
        if rc is None:
            return ""
        return f" (exit status {rc}{', signal ' + signal.Signals(-rc).name if rc < 0 else ''})"

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call(cmd="quit")
        except (OSError, ValueError, RuntimeError):
            pass
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---- initiator ----------------------------------------------------------------------------


def initiator_main(args: argparse.Namespace) -> int:
    out = open(args.json, "w") if args.json and args.json != "-" else sys.stdout

    def emit(rec: Dict[str, Any]) -> None:
        out.write(json.dumps(rec) + "\n")
        out.flush()

    label = args.label or args.engine
    emit({"type": "meta", "tool": "bench/compare/peers.py", "engine": label, "machine": machine(),
          "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_start": loadavg(), "argv": sys.argv[1:],
          "env": {k: v for k, v in os.environ.items() if k.startswith(("UCX_", "MC_", "TENT_"))},
          "on_tent": args.on_tent})
    target = Target(args)
    mem = Mapping(args.span)
    eng = make_engine(args.engine, mem, "initiator", args.on_tent)
    eng.connect(target.info)
    failures = crashes = 0
    seed = int(time.time()) & 0xFFFF
    try:
        for op in args.op:
            for block in args.block_size:
                key = {"engine": label, "transport": args.transport, "mem": "register", "op": op,
                       "block_size": block, "batch": args.batch, "threads": 1}
                if target.proc.poll() is not None:
                    emit({"type": "error", **key, "error": f"the target is gone{target.exit_note()}"})
                    failures += 1
                    continue
                try:
                    rec = run_point(args, eng, target, op, block, seed)
                    seed += 1
                    rec.update(key)
                    if rec.get("problems"):
                        failures += 1
                except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                    rec = {"type": "error", **key, "error": f"{type(exc).__name__}: {exc}"}
                    failures += 1
                    note = target.exit_note()
                    if note:
                        rec["target_crash"] = note.strip(" ()")
                        crashes += 1
                emit(rec)
                print(f"{label} {op} {block}: " + (f"{rec['gbps']:.3f} GB/s" if "gbps" in rec else rec["error"]),
                      file=sys.stderr)
    finally:
        target.close()
        if target.proc.returncode and target.proc.returncode < 0:
            crashes += 1
        try:
            eng.close()
        except Exception:  # noqa: BLE001
            pass
        emit({"type": "summary", "engine": label, "failures": failures, "target_crashes": crashes,
              "target_exit": target.proc.returncode, "load_end": loadavg()})
        if out is not sys.stdout:
            out.close()
    return 1 if failures else 0


def run_point(args: argparse.Namespace, eng: Any, target: Target, op: str, block: int, seed: int) -> Dict[str, Any]:
    span = max(min(args.span, block * args.batch), block)
    offs = layout(block, args.batch, span, 0, args.layout)
    cov = covered(block, args.batch, 1, span)
    want = None
    if args.check:
        if op == "WRITE":
            fill(eng.mem.addr, cov, seed)
            want = crc(eng.mem.addr, cov)
        else:
            want = target.call(cmd="fill", seed=seed, len=cov)["crc"]
    nwarm = max(1, min(args.batch, (64 << 20) // block))
    warm = eng.prepare(op, offs[:nwarm], block)
    try:
        eng.run(warm)
    finally:
        eng.release(warm)
    prepared = eng.prepare(op, offs, block)
    lat: List[float] = []
    try:
        t0 = time.perf_counter()
        end = t0 + args.duration
        while True:
            t1 = time.perf_counter()
            eng.run(prepared)
            t2 = time.perf_counter()
            lat.append(t2 - t1)
            if t2 >= end:
                break
        secs = time.perf_counter() - t0
    finally:
        eng.release(prepared)
    n = len(lat)
    moved = n * args.batch * block
    rec: Dict[str, Any] = {"type": "point", "span": span, "layout": args.layout, "batches": n, "requests": n * args.batch, "bytes": moved,
                           "seconds": secs, "gbps": moved / secs / 1e9, "requests_per_s": n * args.batch / secs,
                           "batch_us": percentiles(lat), "request_us": percentiles([x / args.batch for x in lat])}
    if want is not None:
        got = target.call(cmd="crc", len=cov)["crc"] if op == "WRITE" else crc(eng.mem.addr, cov)
        rec["check"] = "ok" if got == want else f"crc32 {got:08x} != {want:08x}"
        if got != want:
            rec["problems"] = [f"checksum: {rec['check']}"]
    return rec


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["mooncake", "nixl"], required=True)
    p.add_argument("--role", choices=["initiator", "target"], default="initiator")
    p.add_argument("--on-tent", action="store_true",
                   help="the same calls on tent's drop-in APIs (tent.compat.mooncake / tent.compat.nixl)")
    p.add_argument("--label", help="the engine's name in the output (default: --engine)")
    p.add_argument("--transport", default="", help="recorded in the output (what the engine was configured to use)")
    p.add_argument("--op", type=parse_ops, default=["WRITE", "READ"])
    p.add_argument("--block-size", type=parse_sizes, default=parse_sizes("4K-64M"))
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--span", type=parse_size, default=256 << 20)
    p.add_argument("--layout", choices=LAYOUTS, default="contiguous")
    p.add_argument("--check", action="store_true")
    p.add_argument("--json", default="-")
    p.add_argument("--ctl-in", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ctl-out", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == "target":
        return target_main(args)
    return initiator_main(args)


if __name__ == "__main__":
    sys.exit(main())
