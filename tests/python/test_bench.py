"""Smoke tests of tent-bench (tent._bench) and its C++ twin
(cpp_examples/bench.cc): tiny sizes, a fraction of a second per point,
--check, and the JSON lines parsed and sanity-checked, so the tools cannot
rot. The figures themselves are benchmarks, not tests (docs/BENCHMARKS.md)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import tent
from conftest import SOURCE_DIR

TRANSPORTS = [("local", "alloc"), ("shm", "alloc"), ("shm", "register"), ("tcp", "alloc")]
OPS = ["WRITE", "READ"]
BLOCKS = [4096, 65536]
THREADS = [1, 2]
BATCH = 8
SWEEP = ["--transport", "local,shm,shm:register,tcp", "--op", "write,read", "--block-size", "4K,64K",
         "--batch", str(BATCH), "--threads", "1,2", "--duration", "0.05", "--check", "--span", "1M",
         "--memcpy-seconds", "0.01", "--iperf3-seconds", "1", "--no-progress"]


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_sweep(recs, impl):
    assert recs[0]["type"] == "meta" and recs[0]["impl"] == impl
    assert recs[0]["machine"]["nproc"] >= 1 and recs[0]["version"] == tent.version()
    assert recs[-1]["type"] == "summary" and recs[-1]["failures"] == 0 and recs[-1]["target_crashes"] == 0
    errors = [r for r in recs if r["type"] == "error"]
    assert errors == []
    points = [r for r in recs if r["type"] == "point"]
    want = {(t, m, op, b, BATCH, th) for t, m in TRANSPORTS for op in OPS for b in BLOCKS for th in THREADS}
    got = {(r["transport"], r["mem"], r["op"], r["block_size"], r["batch"], r["threads"]) for r in points}
    assert got == want and len(points) == len(want)
    for r in points:
        assert r["gbps"] > 0 and r["requests_per_s"] > 0 and r["batches"] >= 1, r
        assert r["bytes"] == r["batches"] * BATCH * r["block_size"], r
        assert r["check"] == "ok" and r["served_by"] == [r["transport"]] and r["retried"] == 0, r
        assert "problems" not in r, r
        b, q = r["batch_us"], r["request_us"]
        assert 0 < b["p50"] <= b["p99"] <= b["p999"] <= b["max"], r
        assert q["avg"] == pytest.approx(b["avg"] / BATCH), r
    limits = [r for r in recs if r["type"] == "limit"]
    memcpy = {r["block_size"]: r["gbps"] for r in limits if r["kind"] == "memcpy"}
    assert set(memcpy) == set(BLOCKS) and min(memcpy.values()) > 0
    iperf = [r for r in limits if r["kind"] == "iperf3"]
    assert iperf, "iperf3 was not attempted"
    if shutil.which("iperf3"):
        assert all(r["gbps"] and r["gbps"] > 0 for r in iperf), iperf
        assert all(r["limit"]["kind"] == "iperf3" and r["limit"]["fraction"] > 0
                   for r in points if r["transport"] == "tcp")
    else:
        assert "iperf3 not found" in iperf[0]["note"]
    assert all(r["limit"]["kind"] == "memcpy" for r in points if r["transport"] != "tcp")


def test_tent_bench_sweep(tmp_path):
    out = tmp_path / "bench.jsonl"
    p = subprocess.run([sys.executable, "-m", "tent", "bench", *SWEEP, "--json", str(out)],
                       capture_output=True, text=True, timeout=240, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    check_sweep(records(out), "python")
    # the table: one row per point, with the fraction of its limit
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith(("local/", "shm/", "tcp/"))]
    assert len(rows) == 32 and all(ln.rstrip().endswith("ok") for ln in rows), p.stdout
    assert "% memcpy" in p.stdout and "limit memcpy" in p.stdout

    # an earlier run's table (and plot) from its JSON lines
    png = tmp_path / "out.png"
    p = subprocess.run([sys.executable, "-m", "tent", "bench", "--from-json", str(out), "--plot", str(png)],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # refused before anything is printed (test_cli.py covers it in detail)
        assert p.returncode == 2 and "matplotlib is not installed" in p.stderr and not png.exists(), p.stderr
        p = subprocess.run([sys.executable, "-m", "tent", "bench", "--from-json", str(out)],
                           capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    else:
        assert png.stat().st_size > 1000
    assert p.returncode == 0, p.stderr
    assert len([ln for ln in p.stdout.splitlines() if ln.startswith(("local/", "shm/", "tcp/"))]) == 32


def test_tent_bench_json_to_stdout_and_byte_budget(tmp_path):
    p = subprocess.run(["tent-bench" if shutil.which("tent-bench") else sys.executable, *(
        [] if shutil.which("tent-bench") else ["-m", "tent", "bench"]),
        "--transport", "local", "--block-size", "1M", "--batch", "4", "--duration", "30", "--bytes", "16M",
        "--no-limits", "--json"], capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    recs = [json.loads(ln) for ln in p.stdout.splitlines()]
    (pt,) = [r for r in recs if r["type"] == "point"]
    assert pt["bytes"] == 16 << 20 and pt["seconds"] < 30  # the byte budget ended the point
    assert "local/alloc" in p.stderr  # the table goes to stderr when the JSON takes stdout


def test_tent_bench_bad_arguments(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tent", "bench", "--transport", "carrier-pigeon"],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert p.returncode != 0 and "unknown transport" in p.stderr
    p = subprocess.run([sys.executable, "-m", "tent", "bench", "--block-size", "4Q"],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert p.returncode == 2 and "bad size" in p.stderr


def test_bench_parsers():
    from tent import _bench

    assert _bench.parse_sizes("4K-64M") == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20,
                                            64 << 20]
    assert _bench.parse_sizes("4K-32K/2,1M") == [4 << 10, 8 << 10, 16 << 10, 32 << 10, 1 << 20]
    assert _bench.layout(1 << 20, 4, 2 << 20, 1) == [0, 1 << 20, 0, 1 << 20]
    assert _bench.covered(4096, 8, 2, 1 << 20) == 16 * 4096
    s = _bench.percentiles([0.001 * i for i in range(1, 1001)])
    assert s["p50"] == pytest.approx(500e3) and s["p99"] == pytest.approx(990e3) and s["max"] == pytest.approx(1e6)


CPP_BENCH = os.path.join(SOURCE_DIR, "build", "cpp_examples", "bench")


@pytest.mark.skipif(not os.path.exists(CPP_BENCH), reason="build/cpp_examples/bench not built (make cpp-examples)")
def test_cpp_bench_sweep(tmp_path):
    out = tmp_path / "bench.jsonl"
    p = subprocess.run([CPP_BENCH, *SWEEP, "--json", str(out)], capture_output=True, text=True, timeout=240,
                       cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(out)
    check_sweep(recs, "c++")


@pytest.mark.skipif(not os.path.exists(CPP_BENCH), reason="build/cpp_examples/bench not built (make cpp-examples)")
def test_python_initiator_drives_cpp_target(tmp_path):
    target = subprocess.Popen([CPP_BENCH, "--role", "target", "--idle-seconds", "30"], stdout=subprocess.PIPE,
                              text=True)
    try:
        hello = json.loads(target.stdout.readline())
        assert hello["impl"] == "c++"
        out = tmp_path / "x.jsonl"
        p = subprocess.run([sys.executable, "-m", "tent", "bench", "--role", "initiator", "--target",
                            hello["segment"], "--transport", "shm,shm:register,tcp", "--op", "write,read",
                            "--block-size", "64K", "--batch", "4", "--duration", "0.05", "--check", "--no-limits",
                            "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
        assert p.returncode == 0, p.stdout + p.stderr
        points = [r for r in records(out) if r["type"] == "point"]
        assert len(points) == 6 and all(r["check"] == "ok" for r in points)
        assert target.wait(20) == 0  # the initiator told it to quit
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
