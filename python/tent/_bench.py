"""tent-bench (``python -m tent bench``): a quick measurement of tent
transfers from this process to a peer process on this machine.

For each ``--transport`` x ``--op`` x ``--block-size``, batches of
``--batch`` requests (submitted and waited for one at a time) run for
``--duration`` seconds after one untimed warm-up batch; requests wrap
within 256 MiB per side. Printed: GB/s (1e9 bytes/s), requests/s, the
batch latency (submit to wait returning) p50 and p99, the transport that
served the last batch, and with ``--check`` a CRC-32 comparison of the
destination with the source after the point. ``local`` moves data within
this process; shm, tcp and rdma to a peer (``python -m tent peer``) that
allocates its memory with tent_alloc. rdma needs a verbs device (or the
fake libibverbs the tests build, named by TENT_RDMA_VERBS_LIBRARY); where
there is none the run stops with the reason the engine gives.

This is the small runner shipped with the package. The benchmarks
themselves (sweeps with the machine's limits, plots, the C++ twin, the
comparison with other engines, the per-call cost of the Python layer) live
in the source tree's bench/ (see docs/BENCHMARKS.md there).

Exit status: 0 when every point ran (and checked), 1 if one failed, 2 for
bad arguments, 3 when a tent error stopped the run (one line on stderr;
``--debug`` or ``TENT_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from typing import Any, Dict, List, Optional, Sequence

from ._units import parse_seconds, parse_size

TRANSPORTS = ("local", "shm", "tcp", "rdma")
SPAN = 256 << 20


def _list(parse: Any, allowed: Optional[Sequence[str]] = None) -> Any:
    def parse_list(text: str) -> List[Any]:
        out = [parse(x.strip()) for x in text.split(",") if x.strip()]
        if not out:
            raise argparse.ArgumentTypeError(f"empty list {text!r}")
        if allowed is not None and any(x not in allowed for x in out):
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)}")
        return out

    return parse_list


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return n


def percentile(sorted_xs: List[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, nearest rank."""
    return sorted_xs[min(len(sorted_xs) - 1, max(0, int(round(q * len(sorted_xs))) - 1))]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transport", type=_list(str, TRANSPORTS), default=["shm", "tcp"],
                   help="comma-separated: local, shm, tcp, rdma (default shm,tcp)")
    p.add_argument("--op", type=_list(str.upper, ("READ", "WRITE")), default=["WRITE"],
                   help="write and/or read (default write)")
    p.add_argument("--block-size", type=_list(parse_size), default=[64 << 10],
                   help="bytes per request, comma-separated (default 64K)")
    p.add_argument("--batch", type=_positive, default=128, help="requests per batch (128)")
    p.add_argument("--duration", type=parse_seconds, default=2.0, help="seconds per point (2); at least one batch")
    p.add_argument("--check", action="store_true", help="compare CRC-32s of the destination and the source")
    p.add_argument("--timeout", type=parse_seconds, default=120.0, help="batch deadline in seconds (120)")
    p.add_argument("--streams", type=int, default=0, help="TCP connections per peer (default: the library's)")
    p.add_argument("--json", action="store_true", help="one JSON line per point on stdout instead of the table")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the full traceback of an error (also TENT_DEBUG=1)")


def _point(engine: Any, peer: Any, local: Any, transport: str, op: str, block: int, args: argparse.Namespace
           ) -> Dict[str, Any]:
    from . import _cli
    from ._requests import READ, WRITE

    span = max(block, min(SPAN, block * args.batch))
    slots = span // block
    cov = min(slots, args.batch) * block
    if transport == "local":
        target = local["target"]
        seg, remote = local["segment"], target.addr

        def remote_crc() -> int:
            return zlib.crc32(target.view()[:cov])
    else:
        seg, remote = engine.open_segment(peer.name), peer.addr

        def remote_crc() -> int:
            return int(peer.call("crc", offset=0, length=cov)["crc"])
    src = local["source"]
    opcode = WRITE if op == "WRITE" else READ
    try:
        reqs = (_cli._lib.Request * args.batch)()
        for i in range(args.batch):
            off = (i % slots) * block
            reqs[i] = _cli._lib.Request(opcode, 0, src.addr + off, seg.handle, remote + off, block)
        want = None
        if args.check:
            if op == "WRITE":
                src.view()[:cov] = os.urandom(cov)
                want = zlib.crc32(src.view()[:cov])
            else:
                if transport == "local":
                    local["target"].view()[:cov] = os.urandom(cov)
                else:
                    peer.call("fill")
                want = remote_crc()
                src.view()[:cov] = bytes(cov)
        _cli.run_batches(engine, reqs, transport, 1, args.timeout)  # warm-up: connections, mappings
        lat: List[float] = []
        t0 = time.perf_counter()
        end = t0 + args.duration
        while True:
            t1 = time.perf_counter()
            with engine.transfer(reqs, transport=transport, timeout=args.timeout) as b:
                b.wait()
            t2 = time.perf_counter()
            lat.append(t2 - t1)
            if t2 >= end:
                break
        secs = time.perf_counter() - t0
        _, results = _cli.run_batches(engine, reqs, transport, 1, args.timeout)
    finally:
        if transport != "local":
            seg.close()
    moved = len(lat) * args.batch * block
    lat.sort()
    rec: Dict[str, Any] = {"type": "point", "transport": transport, "op": op, "block_size": block,
                           "batch": args.batch, "batches": len(lat), "bytes": moved, "seconds": secs,
                           "gbps": moved / secs / 1e9, "requests_per_s": len(lat) * args.batch / secs,
                           "batch_us": {"p50": percentile(lat, 0.5) * 1e6, "p99": percentile(lat, 0.99) * 1e6},
                           "served_by": sorted({r.transport for r in results})}
    problems = []
    if rec["served_by"] != [transport]:
        problems.append(f"served by {','.join(rec['served_by'])}, not {transport}")
    if want is not None:
        got = remote_crc() if op == "WRITE" else zlib.crc32(src.view()[:cov])
        rec["check"] = "ok" if got == want else f"crc32 {got:08x} != {want:08x}"
        if got != want:
            problems.append(f"checksum: {rec['check']}")
    if problems:
        rec["problems"] = problems
    return rec


def main(args: argparse.Namespace) -> int:
    from . import _cli

    kw: Dict[str, Any] = {"timeout": args.timeout}
    if args.streams:
        kw["tcp_streams"] = args.streams
    biggest = max(max(b, min(SPAN, b * args.batch)) for b in args.block_size)
    failures = 0
    with _cli.eng.Engine(**kw) as engine:
        missing = [t for t in args.transport if t != "local" and t not in engine.transports]
        if missing:
            why = engine.stats().get("unavailable", {})
            for t in missing:
                print(f"tent-bench: transport {t} is not installed: {why.get(t, 'not available in this library')}",
                      file=sys.stderr)
            return 3
        local: Dict[str, Any] = {"source": engine.alloc(biggest)}
        peer = None
        try:
            if "local" in args.transport:
                local["target"] = engine.alloc(biggest)
                local["segment"] = engine.open_segment(engine.name)
            if any(t != "local" for t in args.transport):
                peer = _cli.Peer(biggest, timeout=args.timeout)
            if not args.json:
                print(f"{'transport':<9} {'op':<5} {'block':>8} {'batch':>5} {'GB/s':>8} {'req/s':>10} "
                      f"{'p50 us':>9} {'p99 us':>9}  check")
            for t in args.transport:
                for op in args.op:
                    for block in args.block_size:
                        rec = _point(engine, peer, local, t, op, block, args)
                        failures += bool(rec.get("problems"))
                        if args.json:
                            print(json.dumps(rec), flush=True)
                        else:
                            print(f"{t:<9} {op:<5} {_cli.human(block):>8} {args.batch:>5} {rec['gbps']:>8.3f} "
                                  f"{rec['requests_per_s']:>10.0f} {rec['batch_us']['p50']:>9.1f} "
                                  f"{rec['batch_us']['p99']:>9.1f}  {rec.get('check', '-')}"
                                  + (f"  {'; '.join(rec['problems'])}" if rec.get("problems") else ""), flush=True)
        finally:
            if peer is not None:
                peer.close()
            for k in ("segment", "target", "source"):
                if k in local:
                    local[k].close()
    if failures:
        print(f"tent-bench: {failures} points failed", file=sys.stderr)
    return 1 if failures else 0


def bench_main(argv: Optional[Sequence[str]] = None) -> int:
    """The tent-bench console script."""
    from ._cli import guarded

    p = argparse.ArgumentParser(prog="tent-bench", description=__doc__.split("\n\n")[0],
                                epilog="See python -m pydoc tent._bench for details.")
    add_args(p)
    args = p.parse_args(argv)
    return guarded("tent-bench", args, lambda: main(args))
