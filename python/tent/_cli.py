"""``python -m tent``: version, topology, demo, bench (and the peer process
the demo starts). ``tent-bench`` is ``python -m tent bench`` (tent._bench, a
quick measurement; the benchmarks themselves are in the source tree's bench/).

demo: two processes on this machine move data over each available
transport (plus ``local``, inside one process), WRITE and READ, verify
CRC-32 checksums on both sides, and print what moved, how fast and which
transport the library reports having used. Exit status 1 if a checksum
differs or a request was served by another transport than asked.

Needs nothing but this package (numpy is not used).

Exit status (every command): 0 success, 1 a result was wrong (a checksum,
a failed point), 2 bad arguments, 3 a tent error stopped the command
(printed as one line; ``--debug`` or ``TENT_DEBUG=1`` shows its traceback),
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _engine as eng
from . import _lib
from ._errors import TentError
from ._requests import READ, WRITE
from ._units import human, parse_seconds, parse_size

# ---- the peer process ---------------------------------------------------------


def _peer_main(args: argparse.Namespace) -> int:
    """A peer: allocates a buffer, prints {"name", "addr", "size"} and then
    answers one JSON command per stdin line (crc, fill, stats, quit)."""
    secret = os.environ.get("TENT_PEER_SECRET") or None  # not on the command line: ps would show it
    with eng.Engine(transports=args.transports, timeout=args.timeout, secret=secret) as engine:
        with engine.alloc(args.size) as region:
            view = region.view()
            print(json.dumps({"name": engine.name, "addr": region.addr, "size": region.size,
                              "transports": engine.transports, "pid": os.getpid()}), flush=True)
            for line in sys.stdin:
                cmd = json.loads(line)
                op = cmd.get("cmd")
                if op == "crc":
                    off, n = cmd.get("offset", 0), cmd.get("length", region.size)
                    reply: Dict[str, Any] = {"crc": zlib.crc32(view[off:off + n])}
                elif op == "fill":
                    view[:] = os.urandom(region.size)
                    reply = {"crc": zlib.crc32(view)}
                elif op == "zero":
                    view[:] = bytes(region.size)
                    reply = {"crc": zlib.crc32(view)}
                elif op == "stats":
                    reply = engine.stats()
                elif op == "quit":
                    print(json.dumps({"bye": True}), flush=True)
                    break
                else:
                    reply = {"error": f"unknown command {op!r}"}
                print(json.dumps(reply), flush=True)
            view.release()
    return 0


class Peer:
    """A peer process started with ``python -m tent peer`` (spawned: the
    parent's tent state never crosses a fork)."""

    def __init__(self, size: int, transports: Optional[str] = None, timeout: float = 30.0,
                 secret: Optional[str] = None) -> None:
        cmd = [sys.executable, "-m", "tent", "peer", "--size", str(size), "--timeout", str(timeout)]
        if transports:
            cmd += ["--transports", transports]
        env = dict(os.environ)
        env.pop("TENT_PEER_SECRET", None)
        if secret is not None:
            env["TENT_PEER_SECRET"] = secret
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        hello = self._read(timeout)
        self.name: str = hello["name"]
        self.addr: int = hello["addr"]
        self.size: int = hello["size"]
        self.transports: List[str] = hello["transports"]
        self.timeout = timeout

    def _read(self, timeout: float) -> Dict[str, Any]:
        assert self.proc.stdout is not None
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            raise RuntimeError(f"the peer process did not answer (exit status {self.proc.poll()})")
        return json.loads(line)

    def call(self, cmd: str, **kw: Any) -> Dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._read(self.timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("quit")
                self.proc.wait(10)
            except Exception:  # noqa: BLE001 - kill a peer that does not quit
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- moving data ----------------------------------------------------------------


def requests_for(op: int, local_addr: int, segment: eng.Segment, remote_addr: int, total: int,
                 block: int) -> Any:
    """A ctypes array of requests covering total bytes in blocks (no numpy)."""
    n = (total + block - 1) // block
    arr = (_lib.Request * n)()
    h = segment.handle
    for i in range(n):
        off = i * block
        arr[i] = _lib.Request(op, 0, local_addr + off, h, remote_addr + off, min(block, total - off))
    return arr


def run_batches(engine: eng.Engine, reqs: Any, transport: Optional[str], iters: int,
                timeout: Optional[float] = None) -> Tuple[float, List[Any]]:
    """Submits reqs iters times (one batch each, waited for); returns
    (best seconds per batch, the last batch's results)."""
    best = float("inf")
    results: List[Any] = []
    for _ in range(iters):
        t0 = time.perf_counter()
        with engine.transfer(reqs, transport=transport, timeout=timeout) as batch:
            batch.wait()
            dt = time.perf_counter() - t0
            results = batch.status()
        best = min(best, dt)
    return best, results


def _demo_main(args: argparse.Namespace) -> int:
    size, block = args.size, min(args.block_size, args.size)
    rows: List[Dict[str, Any]] = []
    failures = 0
    with eng.Engine(timeout=args.timeout) as engine:
        wanted = [t for t in engine.transports if t != "cuda"]  # cuda moves GPU memory only
        if args.transports:
            wanted = [t for t in args.transports.split(",") if t]
        with engine.alloc(size) as local:
            view = local.view()
            peer: Optional[Peer] = None
            try:
                for t in wanted:
                    if t == "local":
                        target = engine.alloc(size)
                        tview = target.view()
                        seg = engine.open_segment(engine.name)
                        remote_addr = target.addr

                        def remote_crc() -> int:
                            return zlib.crc32(tview)

                        def remote_fill() -> int:
                            tview[:] = os.urandom(size)
                            return zlib.crc32(tview)

                        where = "in-process"
                    else:
                        if peer is None:
                            peer = Peer(size, timeout=args.timeout)
                        seg = engine.open_segment(peer.name)
                        remote_addr = peer.addr
                        p = peer

                        def remote_crc() -> int:
                            return p.call("crc")["crc"]

                        def remote_fill() -> int:
                            return p.call("fill")["crc"]

                        where = f"pid {os.getpid()} -> pid {peer.proc.pid}"
                    try:
                        for op in (WRITE, READ):
                            if op == WRITE:
                                view[:] = os.urandom(size)
                                want = zlib.crc32(view)
                            else:
                                want = remote_fill()
                                view[:] = bytes(size)
                            reqs = requests_for(op, local.addr, seg, remote_addr, size, block)
                            try:
                                secs, results = run_batches(engine, reqs, t, args.iters)
                            except Exception as exc:  # noqa: BLE001 - reported in the table
                                rows.append({"transport": t, "op": "WRITE" if op == WRITE else "READ", "where": where,
                                             "error": f"{type(exc).__name__}: {exc}"})
                                failures += 1
                                continue
                            got = remote_crc() if op == WRITE else zlib.crc32(view)
                            served = sorted({r.transport for r in results})
                            moved = sum(r.bytes for r in results)
                            ok = got == want and served == [t] and moved == size
                            failures += 0 if ok else 1
                            rows.append({
                                "transport": t, "op": "WRITE" if op == WRITE else "READ", "where": where,
                                "bytes": moved, "requests": len(results), "seconds": secs,
                                "gbps": size / secs / 1e9, "served_by": ",".join(served),
                                "retried": sum(r.retried for r in results),
                                "checksum": f"{want:08x}" + (" ok" if got == want else f" != {got:08x}"),
                                "ok": ok,
                            })
                    finally:
                        seg.close()
                        if t == "local":
                            tview.release()
                            target.close()
            finally:
                view.release()
                if peer is not None:
                    peer.close()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"tent {eng.version()}: {human(size)} in {human(block)} requests, best of {args.iters}")
        header = f"{'transport':<10} {'op':<6} {'moved':>10} {'reqs':>5} {'time':>10} {'GB/s':>7} " \
                 f"{'served by':<10} {'checksum (crc32)':<18} where"
        print(header)
        print("-" * len(header))
        for r in rows:
            if "error" in r:
                print(f"{r['transport']:<10} {r['op']:<6} FAILED: {r['error']}")
                continue
            print(f"{r['transport']:<10} {r['op']:<6} {human(r['bytes']):>10} {r['requests']:>5} "
                  f"{r['seconds'] * 1e3:>8.2f}ms {r['gbps']:>7.2f} {r['served_by']:<10} {r['checksum']:<18} "
                  f"{r['where']}")
    return 1 if failures else 0


# ---- entry points -----------------------------------------------------------------------

EXIT_TENT_ERROR = 3
EXIT_INTERRUPTED = 130


def debug_wanted(args: argparse.Namespace) -> bool:
    """--debug on the command line, or TENT_DEBUG set to anything but 0."""
    return bool(getattr(args, "debug", False)) or os.environ.get("TENT_DEBUG", "") not in ("", "0")


def guarded(prog: str, args: argparse.Namespace, run: Callable[[], int]) -> int:
    """run(), with a tent error reported as one line and EXIT_TENT_ERROR
    (a user needs the message, not the ctypes frames), unless debugging
    was asked for: then the traceback propagates unchanged."""
    if debug_wanted(args):
        return run()
    try:
        return run()
    except TentError as exc:
        print(f"{prog}: error: {type(exc).__name__}: {exc} (--debug or TENT_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return EXIT_TENT_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _add_debug(p: argparse.ArgumentParser, top: bool = False) -> None:
    # SUPPRESS below the top level: a subcommand's default must not undo
    # "python -m tent --debug demo".
    p.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="show the full traceback of an error (also TENT_DEBUG=1)")


COMMANDS = ("version", "topology", "demo", "bench")  # what --help lists ("peer" is internal)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tent", description="tent: a transfer engine for LLM inference")
    _add_debug(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    _add_debug(sub.add_parser("version", help="print the package and library versions"))
    _add_debug(sub.add_parser("topology", help="print the GPU topology (JSON)"))
    d = sub.add_parser("demo", help="two processes moving data over each transport, with checksums")
    _add_debug(d)
    d.add_argument("--size", type=parse_size, default=parse_size("64M"), help="bytes per transfer (64M)")
    d.add_argument("--block-size", type=parse_size, default=parse_size("1M"), help="bytes per request (1M)")
    d.add_argument("--iters", type=int, default=3, help="timed repetitions; the best is shown (3)")
    d.add_argument("--transports", help="comma-separated (default: every available one but cuda)")
    d.add_argument("--timeout", type=parse_seconds, default=30.0, help="request deadline in seconds (30)")
    d.add_argument("--json", action="store_true", help="print the rows as JSON")
    from . import _bench

    b = sub.add_parser("bench", help="a quick throughput and latency measurement (same as tent-bench)",
                       description=_bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _bench.add_args(b)
    # No help=: argparse before 3.14 would list it as "peer  ==SUPPRESS==".
    peer = sub.add_parser("peer")
    peer.add_argument("--size", type=int, required=True)
    peer.add_argument("--transports")
    peer.add_argument("--timeout", type=parse_seconds, default=30.0)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    return guarded("python -m tent", args, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    if args.command == "version":
        from . import __version__

        print(f"tent {__version__} (python package), libtent {eng.version()} "
              f"(ABI {_lib.lib().tent_abi_version()}) from {_lib.loaded_path()}")
        return 0
    if args.command == "topology":
        print(json.dumps(eng.topology(), indent=2))
        return 0
    if args.command == "demo":
        return _demo_main(args)
    if args.command == "bench":
        from . import _bench

        return _bench.main(args)
    if args.command == "peer":
        return _peer_main(args)
    return 2  # pragma: no cover


def bench_main(argv: Optional[Sequence[str]] = None) -> int:
    """The tent-bench console script (tent._bench)."""
    from . import _bench

    return _bench.bench_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
