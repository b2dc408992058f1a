"""The small-request goals, read from a comparison's results.

    python3 bench/compare/goals.py [RESULTS] [--before RESULTS] [--json FILE]

RESULTS is a folder written by bench/compare/compare.py (default
bench/compare/results): its raw/run<N>-<engine>-<phase>.jsonl files, one
per run, engine and phase. Every goal is a ratio or a latency taken run by
run (the engines of one run ran one after another, so a ratio pairs the
figures of the same run) and printed as the range over the runs, never as
the best run; a goal is "met" when every run meets it, "in some runs" when
at least one does.

A figure counts only under compare.py's rule: a point whose data was not
checked (CRC-32) and right, or that reports a problem, is not a figure
(the tcp floor moves no engine's data and has no check).

Beside the goals it prints what bounds them on this machine: the C tcp
floor (bench/c/tcp_pingpong.c) at the same batch, and the memcpy limit
from compare.json, so that a target above what the floor itself moves is
visible as such.

--before RESULTS: the same comparison of older code; prints tent's
throughput from 64 KiB up, after over before, as the range over runs
(every pairing of an after run with a before run). The older tools did
not check data, so unchecked points count there (a wrong one never does).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
FLOORS = {"tcp-floor"}
RAW_NAME = re.compile(r"run(\d+)-(.+?)(?:-(batch|one|threads))?\.jsonl$")
KiB = 1024

# (key, engine, peer, block sizes, what the ratio must reach)
RATIO_GOALS = [
    ("tent-shm >= 1.5x NIXL/UCX (cma)", "tent-shm", "nixl-ucx", (4 * KiB, 16 * KiB), 1.5),
    ("tent-tcp >= 2x NIXL/UCX over tcp", "tent-tcp", "nixl-ucx-tcp", (4 * KiB, 16 * KiB), 2.0),
    ("tent-tcp >= 15x Mooncake tcp", "tent-tcp", "mooncake-tcp", (4 * KiB, 16 * KiB), 15.0),
]
LATENCY_GOALS = [  # a batch of one 4 KiB request, p50 in us
    ("shm batch of one <= 8 us", "tent-shm", 8.0),
    ("tcp batch of one <= 20 us", "tent-tcp", 20.0),
]
THREADS_GOAL = ("tcp 2 threads >= 1.5x one at 64 KiB", "tent-tcp", 64 * KiB, 1.5)
TENT_ENGINES = ("tent-tcp", "tent-shm", "tent-shm-vm")

Figures = Dict[Tuple[str, str, str, int], Dict[int, Dict[str, Any]]]


class NoResults(Exception):
    """The folder holds no comparison's raw files."""


# sweep.py has the same label, but importing it imports tent: this file
# runs with any python3, on results copied from another machine.
def size_label(b: int) -> str:
    for unit, n in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n}{unit}"
    return str(b)


def load(results: str, require_check: bool = True) -> Tuple[Figures, Dict[str, List[int]]]:
    """(engine, phase, op, block) -> run -> point record, for the points
    that count; and per engine the [checked, not checked or wrong] counts.
    require_check=False takes unchecked points too (a comparison from
    before every engine ran with --check), never a wrong one."""
    figs: Figures = {}
    checks: Dict[str, List[int]] = {}
    files = sorted(glob.glob(os.path.join(results, "raw", "run*.jsonl")))
    if not files:
        raise NoResults(f"no raw/run*.jsonl under {results}")
    for path in files:
        m = RAW_NAME.search(os.path.basename(path))
        if not m:
            continue
        run, engine, phase = int(m.group(1)), m.group(2), m.group(3) or "batch"
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("type") != "point":
                    continue
                if engine not in FLOORS:
                    c = checks.setdefault(engine, [0, 0])
                    if rec.get("check") != "ok":
                        c[1] += 1
                        if require_check or "check" in rec:
                            continue
                    c[0] += 1
                if rec.get("problems"):
                    continue
                figs.setdefault((engine, phase, rec["op"], rec["block_size"]), {})[run] = rec
    return figs, checks


def per_run(figs: Figures, a: Tuple[str, str, str, int], b: Optional[Tuple[str, str, str, int]],
            what: str) -> List[float]:
    """a's figure over b's, run by run (a's alone when b is None)."""
    fa = figs.get(a, {})
    if b is None:
        return [value(fa[r], what) for r in sorted(fa)]
    fb = figs.get(b, {})
    return [value(fa[r], what) / value(fb[r], what) for r in sorted(fa) if r in fb and value(fb[r], what)]


def value(rec: Dict[str, Any], what: str) -> float:
    return rec["gbps"] if what == "gbps" else rec["batch_us"][what]


def span(xs: List[float], fmt: str) -> str:
    if not xs:
        return "no figure"
    lo, hi = min(xs), max(xs)
    return (fmt % lo) if fmt % lo == fmt % hi else f"{fmt % lo}-{fmt % hi}"


def verdict(xs: List[float], ok) -> str:
    if not xs:
        return "no figure"
    n = sum(1 for x in xs if ok(x))
    return "met" if n == len(xs) else ("not met" if n == 0 else f"met in {n} of {len(xs)} runs")


def goal_rows(figs: Figures, limits: Dict[str, Any]) -> List[Dict[str, str]]:
    rows: List[Dict[str, str]] = []
    for name, eng, peer, blocks, target in RATIO_GOALS:
        for b in blocks:
            for op in ("WRITE", "READ"):
                xs = per_run(figs, (eng, "batch", op, b), (peer, "batch", op, b), "gbps")
                mine = per_run(figs, (eng, "batch", op, b), None, "gbps")
                theirs = per_run(figs, (peer, "batch", op, b), None, "gbps")
                bound = bound_note(figs, limits, eng, op, b, theirs, target)
                rows.append({"goal": name, "point": f"{size_label(b)} x 128 {op}", "figure": span(xs, "%.2fx"),
                             "detail": f"{eng} {span(mine, '%.2f')} GB/s, {peer} {span(theirs, '%.2f')}" + bound,
                             "verdict": verdict(xs, lambda x, t=target: x >= t)})
    for name, eng, target in LATENCY_GOALS:
        for op in ("WRITE", "READ"):
            xs = per_run(figs, (eng, "one", op, 4 * KiB), None, "p50")
            floor = per_run(figs, ("tcp-floor", "one", op, 4 * KiB), None, "p50")
            detail = f"tcp floor p50 {span(floor, '%.1f')} us"
            if eng == "tent-tcp":
                over = per_run(figs, (eng, "one", op, 4 * KiB), ("tcp-floor", "one", op, 4 * KiB), "p50")
                detail += f"; tent-tcp / floor {span(over, '%.2fx')} (goal: within 2x: {verdict(over, lambda x: x <= 2)})"
            rows.append({"goal": name, "point": f"4K x 1 {op} p50", "figure": span(xs, "%.1f") + " us", "detail": detail,
                         "verdict": verdict(xs, lambda x, t=target: x <= t)})
    name, eng, b, target = THREADS_GOAL
    for op in ("WRITE", "READ"):
        xs = per_run(figs, (eng, "threads", op, b), (eng, "batch", op, b), "gbps")
        floor = per_run(figs, ("tcp-floor", "threads", op, b), ("tcp-floor", "batch", op, b), "gbps")
        need = [x * target for x in per_run(figs, (eng, "batch", op, b), None, "gbps")]
        floor2 = per_run(figs, ("tcp-floor", "threads", op, b), None, "gbps")
        rows.append({"goal": name, "point": f"64K x 128 {op}", "figure": span(xs, "%.2fx"),
                     "detail": f"tcp floor 2 threads / 1: {span(floor, '%.2fx')}; the goal asks {span(need, '%.2f')} GB/s, "
                               f"the C tcp floor moves {span(floor2, '%.2f')} with 2 threads",
                     "verdict": verdict(xs, lambda x, t=target: x >= t)})
    return rows


def bound_note(figs: Figures, limits: Dict[str, Any], eng: str, op: str, b: int, theirs: List[float],
               target: float) -> str:
    """What the target asks for next to what this machine's floor moves."""
    if not theirs:
        return ""
    need = [t * target for t in theirs]
    if eng == "tent-tcp":
        floor = per_run(figs, ("tcp-floor", "batch", op, b), None, "gbps")
        return f"; the goal asks {span(need, '%.2f')} GB/s, the C tcp floor moves {span(floor, '%.2f')}"
    mc = (limits.get("memcpy") or {}).get(str(b))
    mc2 = (limits.get("memcpy_2_threads") or {}).get(str(b))
    if mc:
        return (f"; the goal asks {span(need, '%.2f')} GB/s, C memcpy moves {mc:.2f} (1 thread)"
                + (f" / {mc2:.2f} (2)" if mc2 else ""))
    return ""


def regression_rows(after: Figures, before: Figures) -> List[Dict[str, str]]:
    rows = []
    for eng in TENT_ENGINES:
        for op in ("WRITE", "READ"):
            blocks = sorted(b for (e, ph, o, b) in after if e == eng and ph == "batch" and o == op and b >= 64 * KiB)
            for b in blocks:
                a = [r["gbps"] for r in after[(eng, "batch", op, b)].values()]
                p = [r["gbps"] for r in before.get((eng, "batch", op, b), {}).values()]
                if not p:
                    continue
                xs = [x / y for x in a for y in p]
                rows.append({"goal": "no regression from 64 KiB", "point": f"{eng} {size_label(b)} x 128 {op}",
                             "figure": span(xs, "%.2fx"),
                             "detail": f"after {span(a, '%.2f')} GB/s, before {span(p, '%.2f')}",
                             "verdict": "after's best run below before's worst" if max(a) < min(p) else "no regression"})
    return rows


def report(results: str, before: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
    """The goals table as markdown, and the same as data."""
    figs, checks = load(results)
    limits: Dict[str, Any] = {}
    cj = os.path.join(results, "compare.json")
    if os.path.exists(cj):
        with open(cj) as f:
            limits = json.load(f).get("limits", {})
    runs = sorted({r for f in figs.values() for r in f})
    rows = goal_rows(figs, limits)
    if before:
        rows += regression_rows(figs, load(before, require_check=False)[0])
    lines = [f"Goals of the small-request work, {len(runs)} runs in {results} (ranges over the runs)", "",
             "| goal | point | figure | detail | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {r['goal']} | {r['point']} | {r['figure']} | {r['detail']} | {r['verdict']} |" for r in rows]
    lines += ["", "Data checked (CRC-32), every engine that moves data: "
              + "; ".join(f"{e} {ok} points right, {bad} not checked or wrong" for e, (ok, bad) in sorted(checks.items()))]
    return "\n".join(lines) + "\n", {"runs": runs, "rows": rows, "checks": checks}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("results", nargs="?", default=os.path.join(HERE, "results"))
    p.add_argument("--before", help="results of the same comparison of older code")
    p.add_argument("--json", help="also write the rows as JSON to this file")
    args = p.parse_args(argv)
    try:
        text, data = report(args.results, args.before)
    except NoResults as e:
        print(f"goals: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
