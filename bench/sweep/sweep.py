"""bench/sweep/sweep.py: sweeps of tent's throughput and latency, with the
machine's own limits measured in the same run.

    python bench/sweep/sweep.py [options]     (with the tent wheel installed;
                                               `make bench` runs it in build/venv-test)

The wheel's ``tent-bench`` (tent._bench) is the small runner for one quick
measurement; this is the full tool: sweeps, limits, checks, plots, replays,
and the control protocol its C++ twin (bench/sweep/sweep.cc) speaks too.

Roles (``--role``):

- ``both`` (default): this process is the initiator and spawns the target
  (``sweep.py --role target``) on this machine; the ``local`` transport
  gets a target engine inside this process (a thread).
- ``target``: allocates nothing until asked; prints one JSON line with its
  segment name, then serves control messages until told to quit.
- ``initiator``: ``--target NAME`` is a target started elsewhere.

The control channel between initiator and target is tent's own
notifications (text messages ``tb1 ID COMMAND ARGS``, answered with
``tb1 ID ok key=value ...`` or ``tb1 ID err MESSAGE``), so the roles need
nothing but a reachable segment, and a Python initiator drives a C++ target
(``bench/sweep/sweep.cc``) and the other way round.

Sweeps: every combination of ``--transport`` (``local,shm,tcp``; an entry
``shm:register`` picks the target's memory kind for that transport),
``--target-mem`` (``alloc``: tent_alloc memfd memory, which shm maps;
``register``: plain registered memory, which shm reaches with
process_vm_readv/writev), ``--op``, ``--block-size``, ``--batch`` and
``--threads``. Each point runs for ``--duration`` seconds or until
``--bytes`` moved, whichever comes first (at least one batch). A batch's
requests cover batch x block bytes, wrapping around within ``--span`` bytes
of memory on each side; local and remote offsets are equal.

Per point: GB/s (1e9 bytes/s), requests/s, batch latency (submit to wait
returning: avg, p50, p99, p99.9, max) and the per-request figures, which
are the batch latency divided by the requests in it (amortized, not the
latency of one request alone; run ``--batch 1`` for that). ``--check``
fills the source with a fresh pattern before each point and compares
CRC-32 checksums of the destination and the source after it.

Limits, measured in the same run unless ``--no-limits``: single-thread
memcpy of the same block sizes laid out as the requests are
(build/bench/memcpy_floor, bench/c/memcpy_floor.c; where it is not built,
ctypes.memmove, whose per-call cost of ~0.1-0.3 us shows at small blocks;
the limit record says which) and one
``iperf3`` stream over loopback, before and after the sweep. Each figure is
shown as a fraction of its limit: local and shm of memcpy at that block
size, tcp of iperf3 (the mean of the before and after runs).

Exit status: 0 when every point ran (and checked, with ``--check``), 1 if
any failed, 2 for bad arguments (``--plot`` without matplotlib among them:
checked before anything runs), 3 when a tent error stopped the run (one
line on stderr; ``--debug`` or ``TENT_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import mmap
import os
import platform
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from tent._units import human, parse_seconds, parse_size

PROTO = "tb1"
MEM_KINDS = ("alloc", "register")
TRANSPORTS = ("local", "shm", "tcp", "rdma")

# ---- sizes and lists ------------------------------------------------------------


def parse_sizes(text: str) -> List[int]:
    """"4K,64K", or a range "4K-64M" (x4 steps) / "4K-64M/2" (x2 steps)."""
    out: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            rng, _, step = part.partition("/")
            lo_s, _, hi_s = rng.partition("-")
            lo, hi = parse_size(lo_s), parse_size(hi_s)
            factor = int(step) if step else 4
            if factor < 2 or hi < lo:
                raise argparse.ArgumentTypeError(f"bad size range {part!r}")
            v = lo
            while v <= hi:
                out.append(v)
                v *= factor
        else:
            out.append(parse_size(part))
    if not out:
        raise argparse.ArgumentTypeError(f"no sizes in {text!r}")
    return out


def parse_ints(text: str) -> List[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad list of integers {text!r}") from None
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError(f"need positive integers: {text!r}")
    return out


def parse_ops(text: str) -> List[str]:
    out = [x.strip().upper() for x in text.split(",") if x.strip()]
    if not out or any(o not in ("READ", "WRITE") for o in out):
        raise argparse.ArgumentTypeError(f"ops are read and/or write, not {text!r}")
    return out


def size_label(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f}s"
    if us >= 1e4:
        return f"{us / 1e3:.1f}ms"
    if us >= 1e3:
        return f"{us / 1e3:.2f}ms"
    return f"{us:.1f}us" if us < 100 else f"{us:.0f}us"


def percentiles(xs: List[float]) -> Dict[str, float]:
    """avg, p50, p99, p999 (nearest rank), max of xs (seconds -> us)."""
    if not xs:
        return {}
    s = sorted(xs)
    n = len(s)

    def rank(q: float) -> float:
        return s[min(n - 1, max(0, math.ceil(q * n) - 1))] * 1e6

    return {"avg": sum(s) / n * 1e6, "p50": rank(0.50), "p99": rank(0.99), "p999": rank(0.999), "max": s[-1] * 1e6}


# ---- memory: plain mappings, a fast fill pattern, CRC-32 --------------------------

_PATTERN_CHUNK = 1 << 20
_PATTERN_SHIFTS = 1 << 16
_pattern: Optional[Any] = None


def _pattern_base() -> Any:
    global _pattern
    if _pattern is None:
        _pattern = ctypes.create_string_buffer(os.urandom(_PATTERN_CHUNK + _PATTERN_SHIFTS), _PATTERN_CHUNK + _PATTERN_SHIFTS)
    return _pattern


def fill(addr: int, length: int, seed: int) -> None:
    """Fills [addr, addr+length) with a pattern that depends on seed and on
    each MiB's position (a window of random bytes at a different byte
    shift per MiB), at memmove speed."""
    base = ctypes.addressof(_pattern_base())
    for i, off in enumerate(range(0, length, _PATTERN_CHUNK)):
        shift = (seed * 2654435761 + i * 4099) % _PATTERN_SHIFTS
        ctypes.memmove(addr + off, base + shift, min(_PATTERN_CHUNK, length - off))


def crc(addr: int, length: int) -> int:
    return zlib.crc32((ctypes.c_char * length).from_address(addr)) & 0xFFFFFFFF


class Memory:
    """`size` bytes of target or initiator memory of one kind: "alloc"
    (engine.alloc: memfd shared memory) or "register" (an anonymous
    mapping, registered)."""

    def __init__(self, engine: Any, kind: str, size: int) -> None:
        self.kind, self.size = kind, size
        self._map: Optional[mmap.mmap] = None
        if kind == "alloc":
            self.region = engine.alloc(size)
        elif kind == "register":
            self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self.region = engine.register(self._map)
        else:
            raise ValueError(f"unknown memory kind {kind!r} (alloc, register)")
        self.addr: int = self.region.addr
        fill(self.addr, size, 0)  # every page touched: no zero-page reads, no first-touch faults in the run

    def close(self) -> None:
        self.region.close()
        if self._map is not None:
            self._map.close()


# ---- the target: serves control messages over tent notifications -------------------


def _kv(reply: str) -> Dict[str, str]:
    out = {}
    for w in reply.split():
        k, _, v = w.partition("=")
        out[k] = v
    return out


class TargetServer:
    """Answers control messages: hello, buf MEM SIZE, fill MEM SEED LEN,
    crc MEM OFF LEN, free MEM, quit."""

    def __init__(self, engine: Any, impl: str = "python") -> None:
        self.engine = engine
        self.impl = impl
        self.bufs: Dict[str, Memory] = {}
        self.stop = threading.Event()

    def handle(self, words: List[str]) -> str:
        cmd, args = words[0], words[1:]
        if cmd == "hello":
            return (f"ok pid={os.getpid()} impl={self.impl} transports={','.join(self.engine.transports)} "
                    f"version={_engine().version()}")
        if cmd == "buf":
            kind, size = args[0], int(args[1])
            m = self.bufs.get(kind)
            if m is None or m.size < size:
                if m is not None:
                    m.close()
                    del self.bufs[kind]
                m = self.bufs[kind] = Memory(self.engine, kind, size)
            return f"ok addr={m.addr} size={m.size}"
        if cmd in ("fill", "crc"):
            m = self.bufs.get(args[0])
            if m is None:
                return f"err no {args[0]} buffer"
            a, n = int(args[1]), int(args[2])
            if cmd == "fill":
                if not 0 < n <= m.size:
                    return f"err length {n} outside the {m.size}-byte buffer"
                fill(m.addr, n, a)
                return f"ok crc={crc(m.addr, n)}"
            if not (0 <= a and 0 < n and a + n <= m.size):
                return f"err range {a}+{n} outside the {m.size}-byte buffer"
            return f"ok crc={crc(m.addr + a, n)}"
        if cmd == "free":
            m = self.bufs.pop(args[0], None)
            if m is not None:
                m.close()
            return "ok"
        if cmd == "quit":
            self.stop.set()
            return "ok"
        return f"err unknown command {cmd!r}"

    def serve(self, idle_seconds: float = 0, parent_pid: int = 0) -> None:
        import tent

        peers: Dict[str, Any] = {}
        idle_since = time.monotonic()
        try:
            while not self.stop.is_set():
                try:
                    sender, msg = self.engine.recv_notification(timeout=0.25)
                except tent.Timeout:
                    if parent_pid and os.getppid() != parent_pid:
                        print("sweep target: the parent process is gone; exiting", file=sys.stderr)
                        return
                    if idle_seconds and time.monotonic() - idle_since > idle_seconds:
                        print(f"sweep target: idle for {idle_seconds:g} s; exiting", file=sys.stderr)
                        return
                    continue
                idle_since = time.monotonic()
                words = msg.decode("utf-8", "replace").split()
                if len(words) < 3 or words[0] != PROTO:
                    continue
                try:
                    reply = self.handle(words[2:])
                except Exception as exc:  # noqa: BLE001 - the initiator gets the message
                    reply = f"err {type(exc).__name__}: {exc}".replace("\n", " ")
                seg = peers.get(sender)
                if seg is None:
                    seg = peers[sender] = self.engine.open_segment(sender)
                self.engine.notify(seg, f"{PROTO} {words[1]} {reply}")
        finally:
            for seg in peers.values():
                seg.close()
            for m in self.bufs.values():
                m.close()
            self.bufs.clear()


class TargetClient:
    """The initiator's side of the control channel."""

    _ids = iter(range(1, 1 << 62))

    def __init__(self, engine: Any, name: str, proc: Optional[subprocess.Popen] = None,
                 where: str = "") -> None:
        self.engine = engine
        self.name = name
        self.proc = proc
        self.where = where
        self.seg = engine.open_segment(name)
        hello = self.call("hello")
        self.pid = int(hello.get("pid", "0"))
        self.impl = hello.get("impl", "?")
        self.transports = [t for t in hello.get("transports", "").split(",") if t]

    def call(self, *words: Any, timeout: float = 60.0) -> Dict[str, str]:
        import tent

        mid = next(self._ids)
        self.engine.notify(self.seg, " ".join([PROTO, str(mid)] + [str(w) for w in words]))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the target {self.name} did not answer {words[0]!r} within {timeout:g} s"
                                   + self._exit_note())
            try:
                _, msg = self.engine.recv_notification(timeout=min(left, 1.0))
            except tent.Timeout:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError("the target process exited" + self._exit_note()) from None
                continue
            parts = msg.decode("utf-8", "replace").split(" ", 3)
            if len(parts) < 3 or parts[0] != PROTO or parts[1] != str(mid):
                continue  # a stale answer
            if parts[2] == "ok":
                return _kv(parts[3] if len(parts) > 3 else "")
            raise RuntimeError(f"target: {parts[3] if len(parts) > 3 else parts[2]}")

    def _exit_note(self) -> str:
        if self.proc is None or self.proc.poll() is None:
            return ""
        rc = self.proc.returncode
        return f" (target exit status {rc}{', signal ' + signal.Signals(-rc).name if rc < 0 else ''})"

    def crashed(self) -> Optional[str]:
        """A description if the spawned target died by a signal or an error."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return self._exit_note().strip(" ()")

    def close(self) -> None:
        try:
            if self.proc is None or self.proc.poll() is None:
                self.call("quit", timeout=10)
        except Exception:  # noqa: BLE001 - a target that does not answer is killed below
            pass
        finally:
            self.seg.close()
            if self.proc is not None:
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()


def _engine() -> Any:
    from tent import _engine as eng

    return eng


def _engine_kwargs(args: argparse.Namespace, listen: Optional[str] = None) -> Dict[str, Any]:
    kw: Dict[str, Any] = {"timeout": args.timeout}
    if listen:
        kw["listen_addr"] = listen
    if args.streams:
        kw["tcp_streams"] = args.streams
    secret = os.environ.get("TENT_BENCH_SECRET")
    if secret:
        kw["secret"] = secret
    return kw


def target_main(args: argparse.Namespace) -> int:
    eng = _engine()
    with eng.Engine(**_engine_kwargs(args, args.listen)) as engine:
        server = TargetServer(engine)
        print(json.dumps({"segment": engine.name, "pid": os.getpid(), "transports": engine.transports,
                          "impl": "python", "version": eng.version()}), flush=True)
        server.serve(args.idle_seconds, args.parent_pid)
    return 0


def spawn_target(args: argparse.Namespace) -> Tuple[subprocess.Popen, Dict[str, Any]]:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "target", "--timeout", str(args.timeout),
           "--idle-seconds", "120", "--parent-pid", str(os.getpid())]
    if args.streams:
        cmd += ["--streams", str(args.streams)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the target process did not start (exit status {proc.returncode})")
    return proc, json.loads(line)


# ---- machine facts and limits ---------------------------------------------------------------


def machine() -> Dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(), "python": platform.python_version(),
            "hostname": socket.gethostname()}


def loadavg() -> List[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


MEMCPY_FLOOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bench", "memcpy_floor")


def memcpy_floor(blocks: Sequence[int], batch: int, threads: Sequence[int], span: Any,
                 seconds: float) -> Optional[Dict[Tuple[int, int], float]]:
    """{(block, threads): GB/s} from bench/c/memcpy_floor.c (build/bench/
    memcpy_floor): C memcpy of each block size in batches laid out as the
    engines' requests are (layout()), best of three rounds; None when it is
    not built. Unlike memcpy_gbps it has no per-call cost of its own."""
    if not os.access(MEMCPY_FLOOR, os.X_OK):
        return None
    out = subprocess.run([MEMCPY_FLOOR, "--block-size", ",".join(str(b) for b in blocks), "--batch", str(batch),
                          "--threads", ",".join(str(t) for t in threads), "--span", str(span),
                          "--seconds", str(seconds)], capture_output=True, text=True, timeout=600, check=True)
    recs = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return {(r["block_size"], r["threads"]): r["gbps"] for r in recs if r.get("type") == "limit"}


def memcpy_gbps(block: int, span: int, seconds: float) -> float:
    """One thread copying block-sized pieces between two span-sized
    buffers (ctypes.memmove) the way a batch lays them out: the best of
    rounds of at least one pass and 16 MiB each, for ~seconds (at least 3
    rounds). The best round, because a limit is what the machine can do
    when nothing else runs."""
    span = max(span, block)
    src = mmap.mmap(-1, span)
    dst = mmap.mmap(-1, span)
    try:
        a = ctypes.addressof(ctypes.c_char.from_buffer(src))
        b = ctypes.addressof(ctypes.c_char.from_buffer(dst))
        fill(a, span, 1)
        fill(b, span, 2)
        slots = span // block
        offs = [i * block for i in range(slots)]
        passes = max(1, (16 << 20) // (slots * block))
        mv = ctypes.memmove
        best = 0.0
        rounds = 0
        t_end = time.perf_counter() + seconds
        while rounds < 3 or time.perf_counter() < t_end:
            t0 = time.perf_counter()
            for _ in range(passes):
                for off in offs:
                    mv(b + off, a + off, block)
            dt = time.perf_counter() - t0
            best = max(best, passes * slots * block / dt / 1e9)
            rounds += 1
        return best
    finally:
        src.close()
        dst.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iperf3_gbps(seconds: float) -> Tuple[Optional[float], str]:
    """One iperf3 stream over loopback: (GB/s, a note). (None, why) when
    iperf3 is missing or fails."""
    exe = shutil.which("iperf3")
    if exe is None:
        return None, "iperf3 not found on PATH (apt-get install iperf3): tcp figures have no limit to compare with"
    seconds = max(1, int(round(seconds)))  # iperf3 -t takes whole seconds (0 would mean forever)
    port = free_port()
    server = subprocess.Popen([exe, "-s", "-1", "-B", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 5
        last = ""
        while time.monotonic() < deadline:
            r = subprocess.run([exe, "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-P", "1", "-J"],
                               capture_output=True, text=True, timeout=seconds + 30)
            try:
                out = json.loads(r.stdout)
            except ValueError:
                out = {}
            end = out.get("end", {})
            summary = end.get("sum_received") or end.get("sum") or {}
            if r.returncode == 0 and summary.get("bits_per_second"):
                return summary["bits_per_second"] / 8e9, f"iperf3 -c 127.0.0.1 -P 1 -t {seconds}"
            last = out.get("error") or r.stderr.strip() or r.stdout.strip()[:200]
            if "refused" not in last:
                break
            time.sleep(0.1)
        return None, f"iperf3 failed: {last}"
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


# ---- the sweep ------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr (only when enabled)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.done = 0
        self.t0 = time.monotonic()
        self.last = 0.0
        self.width = 0

    def show(self, label: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.2:
            return
        self.last = now
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * 24)
        eta = ""
        if 0 < self.done < self.total:
            eta = f" eta {int((now - self.t0) / self.done * (self.total - self.done))}s"
        line = f"\r[{bar:<24}] {self.done}/{self.total} {label}{eta}"
        pad = max(0, self.width - len(line))
        self.width = len(line)
        sys.stderr.write(line + " " * pad)
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()


class Point:
    def __init__(self, transport: str, mem: str, op: str, block: int, batch: int, threads: int) -> None:
        self.transport, self.mem, self.op, self.block, self.batch, self.threads = \
            transport, mem, op, block, batch, threads

    def key(self) -> Dict[str, Any]:
        return {"transport": self.transport, "mem": self.mem, "op": self.op, "block_size": self.block,
                "batch": self.batch, "threads": self.threads}

    def label(self) -> str:
        return f"{self.transport}/{self.mem} {self.op} {size_label(self.block)} b{self.batch} t{self.threads}"


def expand(args: argparse.Namespace) -> List[Point]:
    combos: List[Tuple[str, str]] = []
    for entry in args.transport:
        t, _, mem = entry.partition(":")
        if t not in TRANSPORTS:
            raise SystemExit(f"sweep: unknown transport {t!r} (local, shm, tcp, rdma)")
        mems = [mem] if mem else args.target_mem
        for m in mems:
            if m not in MEM_KINDS:
                raise SystemExit(f"sweep: unknown memory kind {m!r} (alloc, register)")
            if (t, m) not in combos:
                combos.append((t, m))
    return [Point(t, m, op, bs, b, th) for t, m in combos for op in args.op for bs in args.block_size
            for b in args.batch for th in args.threads]


LAYOUTS = ("contiguous", "shuffled")


def layout(block: int, batch: int, span: int, tid: int, order: str = "contiguous") -> List[int]:
    """Offsets (same locally and remotely) of one thread's requests. The
    blocks are consecutive, wrapping within span; "shuffled" lists the same
    blocks in another order, the even-numbered ones and then the odd, so
    that no request continues the one before it (an engine cannot merge
    neighbours: each request costs what a request costs)."""
    slots = max(1, span // block)
    offs = [((tid * batch + i) % slots) * block for i in range(batch)]
    if order == "shuffled":
        offs = offs[0::2] + offs[1::2]
    elif order != "contiguous":
        raise ValueError(f"layout {order!r}: one of {', '.join(LAYOUTS)}")
    return offs


def covered(block: int, batch: int, threads: int, span: int) -> int:
    slots = max(1, span // block)
    return min(slots, batch * threads) * block


class Runner:
    def __init__(self, args: argparse.Namespace, engine: Any, out: Optional[Any]) -> None:
        self.args, self.engine, self.out = args, engine, out
        self.targets: Dict[str, TargetClient] = {}  # "remote" / "inproc"
        self.local: Dict[int, Memory] = {}
        self.remote_bufs: Dict[Tuple[str, str], Tuple[int, int]] = {}
        self.seed = int(time.time()) & 0xFFFF
        self.inproc: Optional[Tuple[Any, TargetServer, threading.Thread]] = None
        self.proc: Optional[subprocess.Popen] = None

    def emit(self, rec: Dict[str, Any]) -> None:
        if self.out is not None:
            self.out.write(json.dumps(rec) + "\n")
            self.out.flush()

    # -- targets --

    def target_for(self, transport: str) -> TargetClient:
        args = self.args
        if transport == "local":
            if "inproc" not in self.targets:
                eng = _engine()
                te = eng.Engine(**_engine_kwargs(args))
                server = TargetServer(te)
                th = threading.Thread(target=server.serve, name="tent-bench-target", daemon=True)
                th.start()
                self.inproc = (te, server, th)
                self.targets["inproc"] = TargetClient(self.engine, te.name, where="in-process")
            return self.targets["inproc"]
        if "remote" not in self.targets:
            if args.role == "initiator":
                self.targets["remote"] = TargetClient(self.engine, args.target, where=args.target)
            else:
                self.proc, hello = spawn_target(args)
                self.targets["remote"] = TargetClient(self.engine, hello["segment"], self.proc,
                                                      where=f"pid {self.proc.pid}")
        return self.targets["remote"]

    def remote_buf(self, tc: TargetClient, kind: str, size: int) -> int:
        key = (tc.name, kind)
        have = self.remote_bufs.get(key)
        if have is None or have[1] < size:
            r = tc.call("buf", kind, size)
            have = self.remote_bufs[key] = (int(r["addr"]), int(r["size"]))
        return have[0]

    def local_buf(self, size: int) -> Memory:
        m = self.local.get(0)
        if m is None or m.size < size:
            if m is not None:
                m.close()
            m = self.local[0] = Memory(self.engine, "register", size)
        return m

    def close(self) -> None:
        for tc in self.targets.values():
            tc.close()
        if self.inproc is not None:
            te, server, th = self.inproc
            server.stop.set()
            th.join(10)
            te.close()
        for m in self.local.values():
            m.close()

    # -- one point --

    def run_point(self, p: Point, progress: Progress) -> Dict[str, Any]:
        from tent import _lib
        from tent._requests import READ, WRITE

        args = self.args
        span = max(min(args.span, p.block * p.batch * p.threads), p.block)
        tc = self.target_for(p.transport)
        remote = self.remote_buf(tc, p.mem, span)
        local = self.local_buf(span)
        cov = covered(p.block, p.batch, p.threads, span)
        opcode = WRITE if p.op == "WRITE" else READ
        seg = tc.seg.handle
        want = None
        if args.check:
            self.seed += 1
            if p.op == "WRITE":
                fill(local.addr, cov, self.seed)
                want = crc(local.addr, cov)
            else:
                want = int(tc.call("fill", p.mem, self.seed, cov)["crc"])
        reqs = []
        for tid in range(p.threads):
            offs = layout(p.block, p.batch, span, tid, args.layout)
            arr = (_lib.Request * p.batch)()
            for i, off in enumerate(offs):
                arr[i] = _lib.Request(opcode, 0, local.addr + off, seg, remote + off, p.block)
            reqs.append(arr)
        # warm-up (connections, mappings): at most 64 MiB
        nwarm = max(1, min(p.batch, (64 << 20) // p.block))
        warm = (_lib.Request * nwarm).from_buffer(reqs[0])
        served = _Served(transports=set(), retried=0)
        served.update(self._one(warm, p.transport, check=True))

        lock = threading.Lock()
        lat: List[List[float]] = [[] for _ in range(p.threads)]
        state = {"bytes": 0, "batches": 0, "stop": False}
        errors: List[BaseException] = []
        per_batch = p.block * p.batch
        budget = args.bytes or 0
        t0 = time.perf_counter()
        end = t0 + args.duration

        def worker(tid: int) -> None:
            mine = lat[tid]
            arr = reqs[tid]
            first = True
            try:
                while True:
                    t1 = time.perf_counter()
                    s = self._one(arr, p.transport, check=first)
                    t2 = time.perf_counter()
                    if first:
                        served.update(s)
                        first = False
                    mine.append(t2 - t1)
                    with lock:
                        state["bytes"] += per_batch
                        state["batches"] += 1
                        if state["stop"] or t2 >= end or (budget and state["bytes"] >= budget):
                            state["stop"] = True
                            return
                    if tid == 0 and progress.enabled:  # no label built per batch when nobody sees it
                        gbps = state["bytes"] / (t2 - t0) / 1e9
                        progress.show(f"{p.label()} {gbps:.2f} GB/s")
            except BaseException as exc:  # noqa: BLE001 - reported for the point
                with lock:
                    state["stop"] = True
                errors.append(exc)

        if p.threads == 1:
            worker(0)
        else:
            ths = [threading.Thread(target=worker, args=(i,)) for i in range(p.threads)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
        secs = time.perf_counter() - t0
        if errors:
            raise errors[0]
        # the last batch's statuses: every request served by the asked transport, none retried
        served.update(self._one(reqs[0], p.transport, check=True))
        all_lat = [x for xs in lat for x in xs]
        rec: Dict[str, Any] = {"type": "point", **p.key(), "span": span, "layout": args.layout, "batches": state["batches"],
                               "requests": state["batches"] * p.batch, "bytes": state["bytes"], "seconds": secs,
                               "gbps": state["bytes"] / secs / 1e9,
                               "requests_per_s": state["batches"] * p.batch / secs,
                               "batch_us": percentiles(all_lat),
                               "request_us": percentiles([x / p.batch for x in all_lat]),
                               "served_by": sorted(served["transports"]), "retried": served["retried"],
                               "target": tc.where}
        problems = []
        if rec["served_by"] != [p.transport]:
            problems.append(f"served by {','.join(rec['served_by'])}, not {p.transport}")
        if served["retried"]:
            problems.append(f"{served['retried']} requests retried on another transport")
        if want is not None:
            if p.op == "WRITE":
                got = int(tc.call("crc", p.mem, 0, cov)["crc"])
            else:
                got = crc(local.addr, cov)
            rec["check"] = "ok" if got == want else f"crc32 {got:08x} != {want:08x}"
            rec["checked_bytes"] = cov
            if got != want:
                problems.append(f"checksum: {rec['check']}")
        if problems:
            rec["problems"] = problems
        return rec

    def _one(self, arr: Any, transport: str, check: bool) -> Dict[str, Any]:
        """One batch, waited for; with check, the transports that served it."""
        with self.engine.transfer(arr, transport=transport, timeout=self.args.timeout) as b:
            b.wait()
            if not check:
                return {}
            from tent import _lib

            st, _ = b._status_array()
            ts = {_lib.lib().tent_transport_name(s.transport).decode() for s in st}
            return {"transports": ts, "retried": sum(1 for s in st if s.flags & _lib.TENT_STATUS_RETRIED)}


class _Served(dict):
    """The transports that served the checked batches, and how many requests were retried."""

    def update(self, other: Any = (), **kw: Any) -> None:  # type: ignore[override]
        if isinstance(other, dict) and "transports" in other:
            self["transports"] |= other["transports"]
            self["retried"] += other["retried"]


# ---- output -----------------------------------------------------------------------------------


def limit_for(rec: Dict[str, Any], limits: Dict[str, Any]) -> Optional[Tuple[str, float]]:
    if rec["transport"] in ("local", "shm"):
        g = limits.get("memcpy", {}).get(rec["block_size"])
        return ("memcpy", g) if g else None
    if rec["transport"] == "tcp":
        vals = [v for v in limits.get("iperf3", []) if v]
        return ("iperf3", sum(vals) / len(vals)) if vals else None
    return None


def table(points: List[Dict[str, Any]], limits: Dict[str, Any], file: Any = sys.stdout) -> None:
    head = (f"{'transport':<13} {'op':<5} {'block':>6} {'batch':>5} {'thr':>3} {'GB/s':>7} {'of limit':>13} "
            f"{'req/s':>9} | {'batch avg':>9} {'p50':>8} {'p99':>8} {'p999':>8} | {'req avg':>8} {'p50':>8} "
            f"{'p99':>8} {'p999':>8} | check")
    print(head, file=file)
    print("-" * len(head), file=file)
    for r in points:
        name = f"{r['transport']}/{r['mem']}"
        if r.get("type") == "error":
            print(f"{name:<13} {r['op']:<5} {size_label(r['block_size']):>6} {r['batch']:>5} {r['threads']:>3} "
                  f"FAILED: {r['error']}", file=file)
            continue
        lim = limit_for(r, limits)
        frac = f"{r['gbps'] / lim[1] * 100:5.1f}% {lim[0]}" if lim else "-"
        b, q = r["batch_us"], r["request_us"]
        chk = r.get("check", "-")
        if r.get("problems"):
            chk = "; ".join(r["problems"])
        print(f"{name:<13} {r['op']:<5} {size_label(r['block_size']):>6} {r['batch']:>5} {r['threads']:>3} "
              f"{r['gbps']:>7.3f} {frac:>13} {r['requests_per_s']:>9.0f} | {fmt_us(b['avg']):>9} "
              f"{fmt_us(b['p50']):>8} {fmt_us(b['p99']):>8} {fmt_us(b['p999']):>8} | {fmt_us(q['avg']):>8} "
              f"{fmt_us(q['p50']):>8} {fmt_us(q['p99']):>8} {fmt_us(q['p999']):>8} | {chk}", file=file)


def print_limits(limits: Dict[str, Any], notes: List[str], file: Any = sys.stdout) -> None:
    if limits.get("memcpy"):
        parts = [f"{size_label(b)} {g:.2f}" for b, g in sorted(limits["memcpy"].items())]
        print("limit memcpy (1 thread, GB/s): " + ", ".join(parts), file=file)
    if limits.get("iperf3"):
        vals = limits["iperf3"]
        print("limit iperf3 (loopback, 1 stream, GB/s): " + ", ".join(f"{v:.3f}" for v in vals)
              + (f" (mean {sum(vals) / len(vals):.3f})" if len(vals) > 1 else ""), file=file)
    for n in notes:
        print(f"note: {n}", file=file)


def _pyplot() -> Tuple[Any, Optional[str]]:
    """(matplotlib.pyplot with the Agg backend, None), or (None, why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return None, f"matplotlib is not installed in {sys.executable} (pip install matplotlib): {exc}"
    return plt, None


def plot_unavailable(path: str) -> Optional[str]:
    """Why --plot PATH cannot be drawn (None if it can). Asked before a
    sweep, so a missing matplotlib costs nothing but this message."""
    _, why = _pyplot()
    return None if why is None else f"--plot {path}: {why}"


def plot(points: List[Dict[str, Any]], limits: Dict[str, Any], path: str, title: str = "sweep") -> Optional[str]:
    """Draws GB/s and batch latency against block size; returns an error
    message when matplotlib is missing."""
    plt, why = _pyplot()
    if why is not None:
        return f"--plot {path}: {why}"
    series: Dict[str, List[Dict[str, Any]]] = {}
    for r in points:
        if r.get("type") != "point":
            continue
        key = r.get("series") or f"{r['transport']}/{r['mem']} {r['op']}"
        if "series" not in r and (r["batch"] != 128 or r["threads"] != 1):
            key += f" b{r['batch']} t{r['threads']}"
        series.setdefault(key, []).append(r)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6))
    # one colour per engine/transport, solid lines for WRITE, dashed for READ
    bases = sorted({k.rsplit(" ", 1)[0] if k.split()[-1] in ("READ", "WRITE") else k for k in series})
    cmap = plt.get_cmap("tab10" if len(bases) <= 10 else "tab20")
    for key, rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["block_size"])
        xs = [r["block_size"] for r in rs]
        last = key.split()[-1]
        base = key.rsplit(" ", 1)[0] if last in ("READ", "WRITE") else key
        style = dict(color=cmap(bases.index(base) % cmap.N), linestyle="--" if last == "READ" else "-",
                     marker="s" if last == "READ" else "o", markersize=4)
        ax1.plot(xs, [r["gbps"] for r in rs], label=key, **style)
        ax2.plot(xs, [r["batch_us"]["p99"] for r in rs], label=key, **style)
    if limits.get("memcpy"):
        mc = sorted(limits["memcpy"].items())
        ax1.plot([b for b, _ in mc], [g for _, g in mc], "k:", linewidth=2, label="memcpy (1 thread)")
    vals = [v for v in limits.get("iperf3", []) if v]
    if vals:
        ax1.axhline(sum(vals) / len(vals), color="gray", linestyle="-.", label="iperf3 loopback (1 stream)")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("GB/s (1e9 B/s), log scale")
    ax1.set_title(f"{title}: bandwidth (WRITE solid, READ dashed)")
    ax2.set_yscale("log")
    ax2.set_ylabel("batch latency p99 (us)")
    ax2.set_title(f"{title}: p99 latency per batch")
    ax1.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def read_jsonl(path: str) -> Tuple[List[Dict[str, Any]], Dict[str, Any], List[str], Dict[str, Any]]:
    points: List[Dict[str, Any]] = []
    limits: Dict[str, Any] = {"memcpy": {}, "iperf3": []}
    notes: List[str] = []
    meta: Dict[str, Any] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            t = r.get("type")
            if t in ("point", "error"):
                points.append(r)
            elif t == "limit" and r.get("kind") == "memcpy":
                limits["memcpy"][r["block_size"]] = r["gbps"]
            elif t == "limit" and r.get("kind") == "iperf3":
                if r.get("gbps"):
                    limits["iperf3"].append(r["gbps"])
                elif r.get("note"):
                    notes.append(r["note"])
            elif t == "meta":
                meta = r
    return points, limits, notes, meta


# ---- main -----------------------------------------------------------------------------------


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("roles")
    g.add_argument("--role", choices=["both", "initiator", "target"], default="both",
                   help="both (default): spawn the target on this machine; initiator: --target NAME; target: serve")
    g.add_argument("--target", help="initiator: the target's segment name (host:port, printed by --role target)")
    g.add_argument("--listen", help="target: listen address (default 127.0.0.1:0; 0.0.0.0:PORT for other hosts)")
    g.add_argument("--idle-seconds", type=parse_seconds, default=0, help="target: exit after this long without messages")
    g.add_argument("--parent-pid", type=int, default=0, help=argparse.SUPPRESS)
    s = p.add_argument_group("sweep (comma-separated lists; every combination runs)")
    s.add_argument("--transport", type=lambda t: [x.strip() for x in t.split(",") if x.strip()],
                   default=["shm", "tcp"],
                   help="local, shm, tcp, rdma; TRANSPORT:MEM picks the target memory for one entry (default shm,tcp)")
    s.add_argument("--target-mem", type=lambda t: [x.strip() for x in t.split(",") if x.strip()],
                   default=["alloc"], help="alloc (tent_alloc, memfd) and/or register (plain registered memory)")
    s.add_argument("--op", type=parse_ops, default=["WRITE"], help="write, read (default write)")
    s.add_argument("--block-size", type=parse_sizes, default=[64 << 10],
                   help="bytes per request: 4K,64K or a range 4K-64M (x4 steps; 4K-64M/2 for x2) (default 64K)")
    s.add_argument("--batch", type=parse_ints, default=[128], help="requests per batch (128)")
    s.add_argument("--threads", type=parse_ints, default=[1], help="initiator threads, each with its own batches (1)")
    r = p.add_argument_group("each point")
    r.add_argument("--duration", type=parse_seconds, default=2.0, help="seconds per point (2); at least one batch")
    r.add_argument("--bytes", type=parse_size, default=0, help="byte budget per point (stops at whichever comes first)")
    r.add_argument("--span", type=parse_size, default=256 << 20,
                   help="memory per side the requests wrap around in (256M)")
    r.add_argument("--layout", choices=LAYOUTS, default="contiguous",
                   help="order of a batch's blocks: contiguous (each request continues the one before it) or "
                        "shuffled (none does) (contiguous)")
    r.add_argument("--check", action="store_true", help="verify the data with CRC-32 after each point")
    r.add_argument("--timeout", type=parse_seconds, default=120.0, help="batch deadline in seconds (120)")
    r.add_argument("--streams", type=int, default=0, help="TCP connections per peer (default: the library's)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", nargs="?", const="-",
                   help="JSON lines: meta, limits, one per point, summary (no FILE or '-': stdout, table to stderr)")
    o.add_argument("--plot", metavar="PNG", help="draw bandwidth and latency against block size (matplotlib)")
    o.add_argument("--progress", action="store_true", default=None, help="progress bar on stderr (default: if a TTY)")
    o.add_argument("--no-progress", dest="progress", action="store_false")
    o.add_argument("--no-limits", dest="limits", action="store_false", help="skip the memcpy and iperf3 limits")
    o.add_argument("--iperf3-seconds", type=parse_seconds, default=3.0, help="length of each iperf3 run, whole seconds (3)")
    o.add_argument("--memcpy-seconds", type=parse_seconds, default=0.3, help="length of each memcpy measurement (0.3)")
    o.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the full traceback of an error (also TENT_DEBUG=1)")
    o.add_argument("--from-json", metavar="FILE",
                   help="print the table (and --plot) of an earlier --json FILE (from sweep.py or sweep.cc)")


def make_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the top of bench/sweep/sweep.py for details.")
    add_args(p)
    return p


def replay(args: argparse.Namespace) -> int:
    """--from-json: the table (and plot) of an earlier run's JSON lines."""
    records, limits, notes, meta = read_jsonl(args.from_json)
    if meta:
        print(f"{meta.get('tool', 'sweep')} ({meta.get('impl', '?')}) {meta.get('date', '')} "
              f"on {meta.get('machine', {}).get('cpu', '?')}")
    print_limits(limits, notes)
    table(records, limits)
    if args.plot:
        msg = plot(records, limits, args.plot)
        print(msg or f"plot: {args.plot}", file=sys.stderr if msg else sys.stdout)
    return 0


def main(args: argparse.Namespace) -> int:
    if args.role == "target":
        return target_main(args)
    if args.plot:
        why = plot_unavailable(args.plot)
        if why is not None:
            print(f"sweep: {why}; nothing was run", file=sys.stderr)
            return 2
    if args.from_json:
        return replay(args)
    if args.role == "initiator" and not args.target:
        print("sweep: --role initiator needs --target NAME", file=sys.stderr)
        return 2
    points = expand(args)
    progress_on = args.progress if args.progress is not None else sys.stderr.isatty()
    out = None
    if args.json:
        out = sys.stdout if args.json == "-" else open(args.json, "w")
    eng = _engine()
    meta = {"type": "meta", "tool": "sweep", "impl": "python", "version": eng.version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(), "load_start": loadavg(),
            "argv": sys.argv[1:]}
    limits: Dict[str, Any] = {"memcpy": {}, "iperf3": []}
    notes: List[str] = []
    results: List[Dict[str, Any]] = []
    failures = crashes = 0
    rc = 0
    try:
        with eng.Engine(**_engine_kwargs(args)) as engine:
            runner = Runner(args, engine, out)
            runner.emit(meta)

            def measure_iperf3(when: str) -> None:
                """One iperf3 stream over loopback, recorded as a limit (or why not)."""
                gbps, note = iperf3_gbps(args.iperf3_seconds)
                runner.emit({"type": "limit", "kind": "iperf3", "when": when, "gbps": gbps, "note": note})
                if gbps:
                    limits["iperf3"].append(gbps)
                else:
                    notes.append(note)

            try:
                want_tcp = any(p.transport == "tcp" for p in points)
                copy_blocks = sorted({p.block for p in points if p.transport in ("local", "shm")})
                if args.limits:
                    floor = memcpy_floor(copy_blocks, max(args.batch), [1], args.span,
                                         args.memcpy_seconds) if copy_blocks else None
                    for b in copy_blocks:
                        if floor is not None:
                            g, how = floor[(b, 1)], "C memcpy, 1 thread (build/bench/memcpy_floor)"
                        else:
                            g = memcpy_gbps(b, max(min(args.span, b * max(args.batch)), b), args.memcpy_seconds)
                            how = "ctypes.memmove, 1 thread (build/bench/memcpy_floor not built)"
                        limits["memcpy"][b] = g
                        runner.emit({"type": "limit", "kind": "memcpy", "block_size": b, "gbps": g, "how": how})
                    if want_tcp:
                        measure_iperf3("before")
                prog = Progress(len(points), progress_on)
                for p in points:
                    prog.show(p.label(), force=True)
                    try:
                        rec = runner.run_point(p, prog)
                        lim = limit_for(rec, limits)
                        if lim:
                            rec["limit"] = {"kind": lim[0], "gbps": lim[1], "fraction": rec["gbps"] / lim[1]}
                        if rec.get("problems"):
                            failures += 1
                    except Exception as exc:  # noqa: BLE001 - one failed point does not stop the sweep
                        rec = {"type": "error", **p.key(), "error": f"{type(exc).__name__}: {exc}"}
                        failures += 1
                        tc = runner.targets.get("remote")
                        why = tc.crashed() if tc is not None else None
                        if why and tc is not None:
                            rec["target_crash"] = why
                            crashes += 1
                            runner.targets.pop("remote").seg.close()
                            runner.remote_bufs = {k: v for k, v in runner.remote_bufs.items() if k[0] != tc.name}
                    runner.emit(rec)
                    results.append(rec)
                    prog.done += 1
                prog.finish()
                if args.limits and want_tcp and shutil.which("iperf3"):
                    measure_iperf3("after")
            finally:
                runner.close()
        # fractions with the final limits (iperf3: mean of before and after)
        for rec in results:
            lim = limit_for(rec, limits) if rec.get("type") == "point" else None
            if lim:
                rec["limit"] = {"kind": lim[0], "gbps": lim[1], "fraction": rec["gbps"] / lim[1]}
        summary = {"type": "summary", "points": len(results), "failures": failures, "target_crashes": crashes,
                   "load_end": loadavg(), "limits": {"memcpy": {str(k): v for k, v in limits["memcpy"].items()},
                                                     "iperf3": limits["iperf3"]}}
        if out is not None:
            out.write(json.dumps(summary) + "\n")
        screen = sys.stderr if args.json == "-" else sys.stdout
        m = meta["machine"]
        print(f"sweep {meta['version']} (python) {meta['date']} | {m['nproc']} cpus, {m['cpu']}, "
              f"kernel {m['kernel']} | load {meta['load_start']} -> {summary['load_end']}", file=screen)
        print_limits(limits, notes, screen)
        table(results, limits, screen)
        if failures:
            print(f"sweep: {failures} of {len(results)} points failed"
                  + (f" ({crashes} target crashes)" if crashes else ""), file=screen)
            rc = 1
        if args.plot:
            msg = plot(results, limits, args.plot)
            print(msg or f"plot: {args.plot}", file=sys.stderr if msg else screen)
    finally:
        if out is not None and out is not sys.stdout:
            out.close()
    return rc


def bench_main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line of sweep.py."""
    from tent._cli import guarded

    args = make_parser("sweep.py").parse_args(argv)
    return guarded("sweep.py", args, lambda: main(args))


if __name__ == "__main__":
    sys.exit(bench_main())
