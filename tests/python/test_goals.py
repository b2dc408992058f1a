"""bench/compare/goals.py: the small-request goals read run by run from a
comparison's raw files, on results written here (no engine runs)."""

import importlib.util
import json
import os
import subprocess
import sys

from conftest import SOURCE_DIR

GOALS_PY = os.path.join(SOURCE_DIR, "bench", "compare", "goals.py")
K = 1024


def goals_module():
    spec = importlib.util.spec_from_file_location("bench_goals", GOALS_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def point(op, block, gbps, p50=100.0, check="ok", **extra):
    rec = {"type": "point", "op": op, "block_size": block, "gbps": gbps,
           "batch_us": {"p50": p50, "p99": p50 * 2}, **extra}
    if check is not None:
        rec["check"] = check
    return rec


def write_raw(res, run, engine, phase, points):
    raw = res / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    name = f"run{run}-{engine}.jsonl" if phase is None else f"run{run}-{engine}-{phase}.jsonl"
    with open(raw / name, "w") as f:
        f.write(json.dumps({"type": "meta"}) + "\n")
        for p in points:
            f.write(json.dumps(p) + "\n")


def rows_by(rows, goal, pt):
    [row] = [r for r in rows if r["goal"].startswith(goal) and r["point"] == pt]
    return row


def test_ratios_pair_the_same_run_and_give_the_range(tmp_path):
    res = tmp_path / "after"
    # run 1: 2.0 / 1.0 = 2.0x; run 2: 3.0 / 2.5 = 1.2x -- pairing across runs would give 0.8x-3.0x
    write_raw(res, 1, "tent-shm", "batch", [point("WRITE", 4 * K, 2.0)])
    write_raw(res, 2, "tent-shm", "batch", [point("WRITE", 4 * K, 3.0)])
    write_raw(res, 1, "nixl-ucx", "batch", [point("WRITE", 4 * K, 1.0)])
    write_raw(res, 2, "nixl-ucx", "batch", [point("WRITE", 4 * K, 2.5)])
    g = goals_module()
    figs, checks = g.load(str(res))
    rows = g.goal_rows(figs, {"memcpy": {str(4 * K): 9.5}})
    row = rows_by(rows, "tent-shm >= 1.5x", "4K x 128 WRITE")
    assert row["figure"] == "1.20x-2.00x"
    assert row["verdict"] == "met in 1 of 2 runs"
    assert "C memcpy moves 9.50" in row["detail"]
    assert rows_by(rows, "tent-shm >= 1.5x", "4K x 128 READ")["verdict"] == "no figure"
    assert checks == {"tent-shm": [2, 0], "nixl-ucx": [2, 0]}


def test_a_point_not_checked_or_wrong_or_with_a_problem_is_no_figure(tmp_path):
    res = tmp_path / "after"
    write_raw(res, 1, "tent-tcp", "batch", [point("WRITE", 4 * K, 9.0, check=None),
                                             point("READ", 4 * K, 9.0, check="crc32 1 != 2"),
                                             point("WRITE", 16 * K, 9.0, problems=["served by shm"])])
    write_raw(res, 1, "nixl-ucx-tcp", "batch", [point(op, b, 1.0) for op in ("WRITE", "READ") for b in (4 * K, 16 * K)])
    g = goals_module()
    figs, checks = g.load(str(res))
    rows = g.goal_rows(figs, {})
    for pt in ("4K x 128 WRITE", "4K x 128 READ", "16K x 128 WRITE"):
        assert rows_by(rows, "tent-tcp >= 2x", pt)["verdict"] == "no figure", pt
    assert checks["tent-tcp"] == [1, 2]
    # the older tools wrote no check: counted there, but a wrong check never is
    figs_before, _ = g.load(str(res), require_check=False)
    assert ("tent-tcp", "batch", "WRITE", 4 * K) in figs_before
    assert ("tent-tcp", "batch", "READ", 4 * K) not in figs_before


def test_latency_threads_and_the_floor(tmp_path):
    res = tmp_path / "after"
    for run, p50 in ((1, 7.5), (2, 9.0)):
        write_raw(res, run, "tent-shm", "one", [point("WRITE", 4 * K, 0.5, p50=p50)])
    write_raw(res, 1, "tent-tcp", "one", [point("READ", 4 * K, 0.1, p50=60.0)])
    write_raw(res, 1, "tcp-floor", "one", [point("READ", 4 * K, 0.1, p50=50.0, check=None)])
    write_raw(res, 1, "tent-tcp", "batch", [point("WRITE", 64 * K, 4.0), point("WRITE", 4 * K, 1.0)])
    write_raw(res, 1, "tent-tcp", "threads", [point("WRITE", 64 * K, 3.0)])
    write_raw(res, 1, "tcp-floor", "batch", [point("WRITE", 4 * K, 1.8, check=None)])
    write_raw(res, 1, "nixl-ucx-tcp", "batch", [point("WRITE", 4 * K, 1.5)])
    g = goals_module()
    figs, _ = g.load(str(res))
    rows = g.goal_rows(figs, {})
    assert rows_by(rows, "shm batch of one", "4K x 1 WRITE p50")["verdict"] == "met in 1 of 2 runs"
    tcp = rows_by(rows, "tcp batch of one", "4K x 1 READ p50")
    assert tcp["verdict"] == "not met" and "tent-tcp / floor 1.20x (goal: within 2x: met)" in tcp["detail"]
    assert rows_by(rows, "tcp 2 threads", "64K x 128 WRITE")["figure"] == "0.75x"
    ratio = rows_by(rows, "tent-tcp >= 2x", "4K x 128 WRITE")
    assert ratio["figure"] == "0.67x" and "the goal asks 3.00 GB/s, the C tcp floor moves 1.80" in ratio["detail"]


def test_cli_before_and_after(tmp_path):
    after, before = tmp_path / "after", tmp_path / "before"
    for run, gbps in ((1, 4.0), (2, 4.4)):
        write_raw(after, run, "tent-tcp", "batch", [point("WRITE", 64 * K, gbps), point("WRITE", 1 << 20, 1.0)])
    for run, gbps in ((1, 3.9), (2, 4.1)):
        # the older tool's file names carry no phase, and its points no check
        write_raw(before, run, "tent-tcp", None, [point("WRITE", 64 * K, gbps, check=None),
                                                   point("WRITE", 1 << 20, 2.0, check=None)])
    out = tmp_path / "goals.json"
    p = subprocess.run([sys.executable, GOALS_PY, str(after), "--before", str(before), "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "2 runs" in p.stdout
    rows = json.loads(out.read_text())["rows"]
    reg = {r["point"]: r for r in rows if r["goal"] == "no regression from 64 KiB"}
    assert reg["tent-tcp 64K x 128 WRITE"]["verdict"] == "no regression"
    assert reg["tent-tcp 64K x 128 WRITE"]["figure"] == "0.98x-1.13x"
    assert reg["tent-tcp 1M x 128 WRITE"]["verdict"] == "after's best run below before's worst"


def test_cli_without_results_says_so(tmp_path):
    p = subprocess.run([sys.executable, GOALS_PY, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no raw/run*.jsonl" in p.stderr
