"""tent next to Mooncake's transfer engine and NIXL, on one machine.

    bench/compare/run.sh [--quick] [--runs N] [--engines LIST] [--duration S] [--block-size 4K-64M]

(run.sh prepares bench/compare/.venv-peers and runs this file in it.)

The workload, the same for every engine: two processes on this machine,
DRAM -> DRAM, batches of 128 requests of one block size (4 KiB - 64 MiB,
x4 steps), WRITE then READ, submit-and-wait one batch at a time for
--duration seconds per point (at least one batch; an untimed warm-up of at
most 64 MiB first), requests wrapping within 256 MiB per side. tent runs
through bench/sweep/sweep.py, the peers through bench/compare/peers.py,
which borrows the sweep's layout and statistics. Every engine runs with
--check: after each point the destination's CRC-32 is compared with the
source's, and a point whose data did not arrive (or was not checked) is a
problem, never a figure.

Three phases per engine and run: "batch" (the sweep above), "one" (a
batch of one 4 KiB request: the round trip a decode step waits on) and, for
the engines that run initiator threads (tent-tcp and the floor), "threads"
(2 threads at 64 KiB, next to the batch phase's 1 thread).

Engines (--engines, comma-separated):
  tent-tcp        tent, transport tcp (4 connections per peer, the default)
  tent-shm        tent, transport shm, target memory from tent_alloc (memfd, mapped)
  tent-shm-vm     tent, transport shm, plain registered target memory (process_vm_readv/writev)
  mooncake-tcp    mooncake-transfer-engine-non-cuda, protocol "tcp", P2PHANDSHAKE metadata
  mooncake-tent   the same with MC_USE_TENT=1 (its TENT backend, if the wheel has one)
  mooncake-api-on-tent  "Mooncake API on tent": mooncake-tcp's client loop, unchanged, on
                  tent.compat.mooncake (what the tent-compat wheel installs as
                  mooncake.engine): protocol "tcp" is tent's tcp transport
  nixl-ucx        NIXL, UCX backend, UCX's own transport choice (cma on one host)
  nixl-ucx-tcp    NIXL, UCX backend, UCX_TLS=tcp
  nixl-api-on-tent  "NIXL API on tent": nixl-ucx's client loop, unchanged, on
                  tent.compat.nixl: the UCX backend is served by tent's best
                  transport for the peer (shm on one host)
  tcp-floor       not an engine: bench/c/tcp_pingpong.c, the same batches over one
                  loopback TCP socket in C (TCP_NODELAY; one send() per block and a
                  round trip per batch), the floor for the tcp-class engines
Every UCX run has UCX_NET_DEVICES=lo (TCP stays on loopback) and
UCX_PROTO_INFO=y (UCX prints the transport it chose; recorded).

Limits, measured in the same run: memcpy in C at each block size, one
thread and two, with the engines' layout of a batch (bench/c/memcpy_floor.c,
build/bench/memcpy_floor; the fractions are of one thread's), and one
iperf3 stream over loopback, before and after. Each figure is the median of --runs runs (engines interleaved within
each run). Crashes (a process killed by a signal) and errors are counted and
reported with their messages, never turned into numbers.

Exit status 1 when any engine's data check failed (the tables still show
everything else), 0 otherwise; an engine that could not run is reported in
the tables, not in the exit status.

Output in bench/compare/results/: compare.md (the tables), goals.md (the
small-request goals run by run, bench/compare/goals.py), compare.json
(medians, every run's figures, limits, versions, errors), raw/*.jsonl (each
run's JSON lines), compare.png (matplotlib), logs/*.log (each run's stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sweep"))
# bench/sweep/sweep.py, beside this folder
from sweep import LAYOUTS, MEMCPY_FLOOR, iperf3_gbps, loadavg, machine, memcpy_floor, parse_sizes, plot, size_label  # noqa: E402
import goals  # noqa: E402  (bench/compare/goals.py, beside this file)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PINGPONG = os.path.join(ROOT, "build", "bench", "tcp_pingpong")
ALL_ENGINES = ["tent-tcp", "tent-shm", "tent-shm-vm", "mooncake-tcp", "mooncake-tent", "mooncake-api-on-tent",
               "nixl-ucx", "nixl-ucx-tcp", "nixl-api-on-tent", "tcp-floor"]
DEFAULT_ENGINES = ALL_ENGINES
FLOORS = {"tcp-floor"}  # measured beside the engines, moving no engine's data: nothing to --check
THREADED = {"tent-tcp", "tcp-floor"}  # the engines whose initiator runs threads (the "threads" phase)
# what each engine is compared with: its class and the limit that applies
KIND = {"tent-tcp": "tcp", "mooncake-tcp": "tcp", "mooncake-tent": "tcp", "nixl-ucx-tcp": "tcp",
        "tent-shm": "shm", "tent-shm-vm": "shm", "nixl-ucx": "shm", "tcp-floor": "tcp",
        "mooncake-api-on-tent": "tcp", "nixl-api-on-tent": "shm"}
# the client loops of peers.py run against tent's drop-in APIs (tent.compat) instead of the wheels
ON_TENT = {"mooncake-api-on-tent", "nixl-api-on-tent"}
ONE_BLOCK = 4096  # the "one" phase: a batch of one request of this size
THREADS_BLOCK, THREADS = 65536, 2  # the "threads" phase
UCX_ENV = {"UCX_NET_DEVICES": "lo", "UCX_PROTO_INFO": "y"}


def phases(engine: str, args: argparse.Namespace) -> List[Tuple[str, int, str, int]]:
    """(phase, batch, block sizes, threads) that the engine runs in each run."""
    out = [("batch", args.batch, args.block_size, 1), ("one", 1, str(ONE_BLOCK), 1)]
    if engine in THREADED:
        out.append(("threads", args.batch, str(THREADS_BLOCK), THREADS))
    return out


def command(engine: str, phase: Tuple[str, int, str, int], args: argparse.Namespace,
            out: str) -> Tuple[List[str], Dict[str, str]]:
    py = sys.executable
    _, batch, blocks, threads = phase
    common = ["--op", "write,read", "--block-size", blocks, "--batch", str(batch),
              "--duration", str(args.duration), "--span", args.span, "--layout", args.layout]
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("UCX_", "MC_")):
            del env[k]
    if engine == "tcp-floor":
        sizes = ",".join(str(b) for b in parse_sizes(blocks))
        return [PINGPONG, "--op", "write,read", "--block-size", sizes, "--batch", str(batch), "--threads",
                str(threads), "--duration", str(args.duration), "--span", args.span, "--json", out], env
    common.append("--check")
    if engine.startswith("tent-"):
        t = {"tent-tcp": "tcp", "tent-shm": "shm:alloc", "tent-shm-vm": "shm:register"}[engine]
        return [py, os.path.join(HERE, "..", "sweep", "sweep.py"), "--transport", t, "--threads", str(threads),
                "--no-limits", "--no-progress", "--json", out, *common], env
    on_tent = ["--on-tent"] if engine in ON_TENT else []
    if engine.startswith("mooncake"):
        if engine == "mooncake-tent":
            env["MC_USE_TENT"] = "1"
        return [py, os.path.join(HERE, "peers.py"), "--engine", "mooncake", "--label", engine, "--transport", "tcp",
                *on_tent, "--json", out] + common, env
    if on_tent:
        return [py, os.path.join(HERE, "peers.py"), "--engine", "nixl", "--label", engine, "--transport", "tent",
                *on_tent, "--json", out] + common, env
    env.update(UCX_ENV)
    if engine == "nixl-ucx-tcp":
        env["UCX_TLS"] = "tcp"
    return [py, os.path.join(HERE, "peers.py"), "--engine", "nixl", "--label", engine,
            "--transport", "ucx-tcp" if engine == "nixl-ucx-tcp" else "ucx", "--json", out] + common, env


def ucx_choice(log: str) -> List[str]:
    """The transports UCX_PROTO_INFO reported for remote memory put/get."""
    found: List[str] = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if "remote memory" in line:
            what = re.sub(r"^\[[^]]*\] \[[^]]*\]\s*\|\s*|\s*\|\s*$", "", line).strip()
            for nxt in lines[i + 1:i + 8]:
                m = re.search(r"\|\s*([0-9.]+\s*\.\.\s*\w+)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|", nxt)
                if m:
                    entry = f"{what}: {m.group(1)} {m.group(2)} via {m.group(3)}"
                    if entry not in found:
                        found.append(entry)
    return found


def run_engine(engine: str, phase: Tuple[str, int, str, int], run: int, args: argparse.Namespace,
               res: str) -> Dict[str, Any]:
    raw = os.path.join(res, "raw", f"run{run}-{engine}-{phase[0]}.jsonl")
    logf = os.path.join(res, "logs", f"run{run}-{engine}-{phase[0]}.log")
    cmd, env = command(engine, phase, args, raw)
    t0 = time.monotonic()
    with open(logf, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            p = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.engine_timeout,
                               cwd=res)
            rc: Optional[int] = p.returncode
        except subprocess.TimeoutExpired:
            rc = None
    secs = time.monotonic() - t0
    recs: List[Dict[str, Any]] = []
    if os.path.exists(raw):
        with open(raw) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        pass
    with open(logf) as f:
        text = f.read()
    out = {"engine": engine, "phase": phase[0], "run": run, "rc": rc, "seconds": secs, "records": recs, "log": logf}
    if rc is None:
        out["crash"] = f"timed out after {args.engine_timeout} s"
    elif rc < 0:
        out["crash"] = f"the initiator process was killed by {signal.Signals(-rc).name}"
    if engine.startswith("nixl") and engine not in ON_TENT:
        out["ucx"] = ucx_choice(text)
    if engine == "mooncake-tent":
        classic = "transfer_engine_impl.cpp" in text and "tcp_transport.cpp" in text
        out["backend_note"] = ("MC_USE_TENT=1 was set, but the log shows the classic engine's files "
                               "(transfer_engine_impl.cpp, tcp_transport.cpp), as without it: this wheel's "
                               "engine.so does not switch to TENT") if classic else "log does not show the classic engine"
    tail = [ln for ln in text.splitlines() if re.search(r"error|Error|ERROR|Traceback|Segmentation|Abort|fatal", ln)]
    out["error_lines"] = tail[-8:]
    return out


class Tally:
    """What the runs' records add up to: the figures per (engine, phase, op,
    block size), and per engine the checked points, crashes and problems.
    A point counts as a figure only if its data check passed (floors have
    none) and it reports no problem; a point whose check failed is also
    listed in wrong_data."""

    def __init__(self, runs: List[Dict[str, Any]], engines: List[str]) -> None:
        self.figures: Dict[Tuple[str, str, str, int], Dict[str, List[float]]] = {}
        self.checked: Dict[str, int] = {e: 0 for e in engines}  # points whose data was checked and right
        self.wrong_data: List[str] = []  # points whose data did not arrive intact: the run fails
        self.problems: Dict[str, List[str]] = {}
        self.crashes: Dict[str, int] = {e: 0 for e in engines}
        self.ucx: Dict[str, List[str]] = {}
        for out in runs:
            e = out["engine"]
            if out.get("crash"):
                self.crashes[e] += 1
                self.problems.setdefault(e, []).append(f"run {out['run']}: {out['crash']}")
            if out.get("ucx"):
                self.ucx.setdefault(e, [])
                for u in out["ucx"]:
                    if u not in self.ucx[e]:
                        self.ucx[e].append(u)
            for rec in out["records"]:
                if rec.get("type") == "summary" and rec.get("target_crashes"):
                    self.crashes[e] += rec["target_crashes"]
                    self.problems.setdefault(e, []).append(
                    f"run {out['run']}: target crashed (exit {rec.get('target_exit')})")
                where = f"run {out['run']} {out['phase']} {rec.get('op')} {size_label(rec.get('block_size', 0))}"
                if rec.get("type") == "error":
                    self.problems.setdefault(e, []).append(f"{where}: {rec['error']}")
                if rec.get("type") != "point":
                    continue
                if e not in FLOORS:
                    # A figure counts only when the data it moved arrived intact.
                    if rec.get("check") != "ok":
                        self.problems.setdefault(e, []).append(f"{where}: data check {rec.get('check', 'not done')}")
                        if "check" in rec:
                            self.wrong_data.append(f"{e} {where}: {rec['check']}")
                        continue
                    self.checked[e] += 1
                if rec.get("problems"):
                    self.problems.setdefault(e, []).append(f"{where}: {'; '.join(rec['problems'])}")
                    continue
                k = (e, out["phase"], rec["op"], rec["block_size"])
                f = self.figures.setdefault(k, {"gbps": [], "p99": [], "p50": []})
                f["gbps"].append(rec["gbps"])
                f["p99"].append(rec["batch_us"]["p99"])
                f["p50"].append(rec["batch_us"]["p50"])
            if out["rc"] not in (0,) and not out.get("crash") and not any(
                    r.get("type") == "point" for r in out["records"]):
                self.problems.setdefault(e, []).append(f"run {out['run']}: exit status {out['rc']}; "
                                                  + " | ".join(out["error_lines"][-3:]))


def pip_freeze() -> List[str]:
    r = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True)
    keep = ("mooncake", "nixl", "ucx", "tent", "numpy", "matplotlib", "torch")
    return [ln for ln in r.stdout.splitlines() if ln.lower().startswith(keep)]


def med(xs: List[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true",
                   help="1 run, 0.5 s per point, blocks 4K,64K,1M,16M (a smoke run: minutes, not a result)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--engines", default=",".join(DEFAULT_ENGINES))
    p.add_argument("--block-size", default="4K-64M")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--span", default="256M")
    p.add_argument("--layout", choices=LAYOUTS, default="contiguous",
                   help="order of a batch's blocks for every engine (sweep.py --layout); the tcp floor's is contiguous")
    p.add_argument("--iperf3-seconds", type=float, default=3.0)
    p.add_argument("--engine-timeout", type=float, default=900.0, help="seconds one engine's sweep may take")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.duration, args.block_size = 1, 0.5, "4K,64K,1M,16M"
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ALL_ENGINES:
            p.error(f"unknown engine {e} ({', '.join(ALL_ENGINES)})")
    sizes = parse_sizes(args.block_size)
    res = args.results
    for d in ("raw", "logs"):
        shutil.rmtree(os.path.join(res, d), ignore_errors=True)
        os.makedirs(os.path.join(res, d), exist_ok=True)

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t_start = time.monotonic()
    meta = {"date": started, "machine": machine(), "load_start": loadavg(), "versions": pip_freeze(),
            "argv": sys.argv[1:], "runs": args.runs, "duration": args.duration, "batch": args.batch,
            "span": args.span, "layout": args.layout, "engines": engines}
    print(f"compare: {started}, {meta['machine']['nproc']} cpus {meta['machine']['cpu']}, load {meta['load_start']}",
          file=sys.stderr)
    print("compare: " + ", ".join(meta["versions"]), file=sys.stderr)

    if not os.access(MEMCPY_FLOOR, os.X_OK):
        p.error(f"{MEMCPY_FLOOR} is not built (make -C {ROOT} build/bench/memcpy_floor; run.sh does)")
    floor = memcpy_floor(sizes, args.batch, [1, 2], args.span, 0.3) or {}
    limits: Dict[str, Any] = {"memcpy": {b: floor[(b, 1)] for b in sizes},
                              "memcpy2": {b: floor[(b, 2)] for b in sizes}, "iperf3": []}
    g, note = iperf3_gbps(args.iperf3_seconds)
    limits["iperf3"].append(g)
    meta["iperf3_note"] = note
    print(f"compare: memcpy {[round(v, 2) for v in limits['memcpy'].values()]} GB/s, iperf3 {g} GB/s ({note})",
          file=sys.stderr)

    if "tcp-floor" in engines and not os.access(PINGPONG, os.X_OK):
        p.error(f"{PINGPONG} is not built (make -C {ROOT} build/bench/tcp_pingpong; run.sh does)")
    runs: List[Dict[str, Any]] = []
    for r in range(1, args.runs + 1):
        for e in engines:
            for ph in phases(e, args):
                print(f"compare: run {r}/{args.runs} {e} {ph[0]} ...", file=sys.stderr, flush=True)
                out = run_engine(e, ph, r, args, res)
                pts = [x for x in out["records"] if x.get("type") == "point"]
                errs = [x for x in out["records"] if x.get("type") == "error"]
                print(f"compare:   {len(pts)} points, {len(errs)} errors, rc {out['rc']}, {out['seconds']:.0f} s"
                      + (f", CRASH: {out['crash']}" if out.get("crash") else ""), file=sys.stderr, flush=True)
                runs.append(out)
    g, note = iperf3_gbps(args.iperf3_seconds)
    limits["iperf3"].append(g)
    meta["load_end"] = loadavg()
    meta["wall_seconds"] = time.monotonic() - t_start

    t = Tally(runs, engines)
    figures, checked, wrong_data, problems, crashes, ucx = (t.figures, t.checked, t.wrong_data, t.problems,
                                                            t.crashes, t.ucx)
    iperf = [v for v in limits["iperf3"] if v]
    iperf_mean = sum(iperf) / len(iperf) if iperf else None

    def fig(e: str, op: str, b: int, what: str = "gbps", phase: str = "batch") -> Optional[float]:
        f = figures.get((e, phase, op, b))
        return med(f[what]) if f else None

    def limit(e: str, b: int) -> Optional[float]:
        return limits["memcpy"].get(b) if KIND[e] == "shm" else iperf_mean

    medians = []
    for (e, phase, op, b), f in sorted(figures.items()):
        lim = limit(e, b)
        medians.append({"engine": e, "phase": phase, "op": op, "block_size": b, "runs": len(f["gbps"]), "gbps": med(f["gbps"]),
                        "batch_p99_us": med(f["p99"]), "batch_p50_us": med(f["p50"]), "gbps_all": f["gbps"],
                        "limit": {"kind": "memcpy" if KIND[e] == "shm" else "iperf3", "gbps": lim,
                                  "fraction": med(f["gbps"]) / lim if lim else None}})

    # ---- tables ----
    lines: List[str] = []
    m = meta["machine"]
    lines.append(f"Comparison run {started} on {m['nproc']} cpus ({m['cpu']}), kernel {m['kernel']}; "
                 f"load {meta['load_start']} -> {meta['load_end']}; {args.runs} runs, median shown; "
                 f"{args.duration:g} s per point; batch {args.batch}, layout {args.layout}; wall {meta['wall_seconds'] / 60:.1f} min.")
    lines.append("")
    lines.append("Limits in this run: memcpy in C (GB/s, 1 thread / 2 threads) "
                 + ", ".join(f"{size_label(b)} {v:.2f} / {limits['memcpy2'][b]:.2f}"
                             for b, v in sorted(limits["memcpy"].items()))
                 + "; iperf3 loopback 1 stream (GB/s) before/after "
                 + " / ".join(f"{v:.3f}" if v else "n/a" for v in limits["iperf3"])
                 + (f" (mean {iperf_mean:.3f})" if iperf_mean else f" ({note})"))
    lines.append("")
    lines.append("Versions: " + ", ".join(meta["versions"]))
    lines.append("")

    def cell(e: str, op: str, b: int) -> str:
        g = fig(e, op, b)
        if g is None:
            return "—"
        p99 = fig(e, op, b, "p99")
        lim = limit(e, b)
        frac = f" ({g / lim * 100:.0f}%)" if lim else ""
        return f"{g:.3f}{frac} / {p99 / 1e3:.2f}"

    for op in ("WRITE", "READ"):
        lines.append(f"### {op}: GB/s (fraction of the limit: memcpy for shm-class, iperf3 for tcp-class) / "
                     f"batch p99 latency in ms")
        lines.append("")
        lines.append("| block | " + " | ".join(engines) + " |")
        lines.append("|---|" + "---|" * len(engines))
        for b in sizes:
            lines.append(f"| {size_label(b)} | " + " | ".join(cell(e, op, b) for e in engines) + " |")
        lines.append("")
    pairs = [(a, b) for a, b in (("tent-tcp", "tcp-floor"), ("tent-tcp", "mooncake-tcp"),
                                 ("tent-tcp", "mooncake-tent"),
                                 ("tent-tcp", "nixl-ucx-tcp"), ("tent-shm", "nixl-ucx"), ("tent-shm-vm", "nixl-ucx"))
             if a in engines and b in engines]
    if pairs:
        lines.append("### Ratios (tent / peer, GB/s medians; > 1: tent faster)")
        lines.append("")
        cols = [f"{a} / {b} {op}" for a, b in pairs for op in ("WRITE", "READ")]
        lines.append("| block | " + " | ".join(cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for bsz in sizes:
            row = []
            for a, b in pairs:
                for op in ("WRITE", "READ"):
                    x, y = fig(a, op, bsz), fig(b, op, bsz)
                    row.append(f"{x / y:.2f}x" if x and y else "—")
            lines.append(f"| {size_label(bsz)} | " + " | ".join(row) + " |")
        lines.append("")
    lines.append(f"### A batch of one {size_label(ONE_BLOCK)} request: batch latency p50 / p99 in us "
                 "(x: p50 over the tcp floor's)")
    lines.append("")
    lines.append("| engine | WRITE | READ |")
    lines.append("|---|---|---|")
    for e in engines:
        row = []
        for op in ("WRITE", "READ"):
            p50, p99 = fig(e, op, ONE_BLOCK, "p50", "one"), fig(e, op, ONE_BLOCK, "p99", "one")
            floor = fig("tcp-floor", op, ONE_BLOCK, "p50", "one")
            x = f" ({p50 / floor:.1f}x)" if p50 and floor and e != "tcp-floor" else ""
            row.append(f"{p50:.1f} / {p99:.1f}{x}" if p50 is not None and p99 is not None else "—")
        lines.append(f"| {e} | " + " | ".join(row) + " |")
    lines.append("")
    threaded = [e for e in engines if e in THREADED]
    if threaded:
        lines.append(f"### {THREADS} initiator threads against 1 at {size_label(THREADS_BLOCK)}, batch {args.batch}: "
                     "GB/s (1 thread / 2 threads = ratio)")
        lines.append("")
        lines.append("| engine | WRITE | READ |")
        lines.append("|---|---|---|")
        for e in threaded:
            row = []
            for op in ("WRITE", "READ"):
                one, two = fig(e, op, THREADS_BLOCK), fig(e, op, THREADS_BLOCK, phase="threads")
                row.append(f"{one:.3f} / {two:.3f} = {two / one:.2f}x" if one and two else "—")
            lines.append(f"| {e} | " + " | ".join(row) + " |")
        lines.append("")
    lines.append("### Data checks, crashes and errors")
    lines.append("")
    for e in engines:
        n_points = sum(len(f["gbps"]) for (en, _, _, _), f in figures.items() if en == e)
        check = "no data check (the floor)" if e in FLOORS else f"{checked[e]} points checked (CRC-32) and right"
        lines.append(f"- {e}: {crashes[e]} crashes, {len(problems.get(e, []))} problems, {n_points} points measured, "
                     f"{check}" + (": " + "; ".join(problems[e][:6]) if problems.get(e) else ""))
    notes = sorted({o["backend_note"] for o in runs if o.get("backend_note")})
    for n in notes:
        lines.append(f"- mooncake-tent: {n}")
    for e, u in ucx.items():
        lines.append(f"- {e}: UCX chose " + "; ".join(u[:6]))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(res, "compare.md"), "w") as f:
        f.write(text)
    with open(os.path.join(res, "compare.json"), "w") as f:
        json.dump({"meta": meta, "limits": {"memcpy": {str(k): v for k, v in limits["memcpy"].items()},
                                            "memcpy_2_threads": {str(k): v for k, v in limits["memcpy2"].items()},
                                            "iperf3": limits["iperf3"]},
                   "medians": medians, "crashes": crashes, "problems": problems, "checked": checked, "ucx": ucx,
                   "runs": [{k: v for k, v in o.items() if k != "records"} for o in runs]}, f, indent=1)
    print(text)
    pts = [{"type": "point", "series": f"{x['engine']} {x['op']}", "op": x["op"], "block_size": x["block_size"],
            "gbps": x["gbps"], "batch_us": {"p50": x["batch_p50_us"], "p99": x["batch_p99_us"]}}
           for x in medians if x["phase"] == "batch"]
    msg = plot(pts, {"memcpy": limits["memcpy"], "iperf3": iperf}, os.path.join(res, "compare.png"),
               title="tent vs Mooncake vs NIXL")
    print(msg or f"plot: {os.path.join(res, 'compare.png')}", file=sys.stderr)
    try:
        goals_text, _ = goals.report(res)
    except goals.NoResults as e:  # no engine ran: the tables above say why
        goals_text = f"goals: {e}\n"
    with open(os.path.join(res, "goals.md"), "w") as f:
        f.write(goals_text)
    print(goals_text)
    print(f"compare: results in {res} (compare.md, goals.md, compare.json, raw/, logs/)", file=sys.stderr)
    for w in wrong_data:
        print(f"compare: WRONG DATA: {w}", file=sys.stderr)
    return 1 if wrong_data else 0


if __name__ == "__main__":
    sys.exit(main())
