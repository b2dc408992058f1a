"""Smoke tests of the benchmark tools in bench/: the sweep (bench/sweep/sweep.py,
run against the installed wheel), its C++ twin (bench/sweep/sweep.cc) and the
wheel's small runner (tent-bench, tent._bench): tiny sizes, a fraction of a
second per point, --check, and the JSON lines parsed and sanity-checked, so
the tools cannot rot. The figures themselves are benchmarks, not tests
(docs/BENCHMARKS.md)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import tent
from conftest import SOURCE_DIR

SWEEP_PY = os.path.join(SOURCE_DIR, "bench", "sweep", "sweep.py")
MEMCPY_FLOOR = os.path.join(SOURCE_DIR, "build", "bench", "memcpy_floor")
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


def test_sweep(tmp_path):
    out = tmp_path / "bench.jsonl"
    p = subprocess.run([sys.executable, SWEEP_PY, *SWEEP, "--json", str(out)],
                       capture_output=True, text=True, timeout=240, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    check_sweep(records(out), "python")
    # the table: one row per point, with the fraction of its limit
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith(("local/", "shm/", "tcp/"))]
    assert len(rows) == 32 and all(ln.rstrip().endswith("ok") for ln in rows), p.stdout
    assert "% memcpy" in p.stdout and "limit memcpy" in p.stdout
    if os.path.exists(MEMCPY_FLOOR):  # the limit is C's memcpy, not ctypes.memmove
        hows = {r["how"] for r in records(out) if r["type"] == "limit" and r["kind"] == "memcpy"}
        assert hows == {"C memcpy, 1 thread (build/bench/memcpy_floor)"}, hows

    # an earlier run's table (and plot) from its JSON lines
    png = tmp_path / "out.png"
    p = subprocess.run([sys.executable, SWEEP_PY, "--from-json", str(out), "--plot", str(png)],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # refused before anything is printed (test_cli.py covers it in detail)
        assert p.returncode == 2 and "matplotlib is not installed" in p.stderr and not png.exists(), p.stderr
        p = subprocess.run([sys.executable, SWEEP_PY, "--from-json", str(out)],
                           capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    else:
        assert png.stat().st_size > 1000
    assert p.returncode == 0, p.stderr
    assert len([ln for ln in p.stdout.splitlines() if ln.startswith(("local/", "shm/", "tcp/"))]) == 32


def test_sweep_json_to_stdout_and_byte_budget(tmp_path):
    p = subprocess.run([sys.executable, SWEEP_PY,
        "--transport", "local", "--block-size", "1M", "--batch", "4", "--duration", "30", "--bytes", "16M",
        "--no-limits", "--json"], capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    recs = [json.loads(ln) for ln in p.stdout.splitlines()]
    (pt,) = [r for r in recs if r["type"] == "point"]
    assert pt["bytes"] == 16 << 20 and pt["seconds"] < 30  # the byte budget ended the point
    assert "local/alloc" in p.stderr  # the table goes to stderr when the JSON takes stdout


def test_sweep_bad_arguments(tmp_path):
    p = subprocess.run([sys.executable, SWEEP_PY, "--transport", "carrier-pigeon"],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert p.returncode != 0 and "unknown transport" in p.stderr
    p = subprocess.run([sys.executable, SWEEP_PY, "--block-size", "4Q"],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert p.returncode == 2 and "bad size" in p.stderr


def test_sweep_parsers():
    sys.path.insert(0, os.path.dirname(SWEEP_PY))
    try:
        import sweep as _bench
    finally:
        sys.path.remove(os.path.dirname(SWEEP_PY))

    assert _bench.parse_sizes("4K-64M") == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20,
                                            64 << 20]
    assert _bench.parse_sizes("4K-32K/2,1M") == [4 << 10, 8 << 10, 16 << 10, 32 << 10, 1 << 20]
    assert _bench.layout(1 << 20, 4, 2 << 20, 1) == [0, 1 << 20, 0, 1 << 20]
    assert _bench.covered(4096, 8, 2, 1 << 20) == 16 * 4096
    s = _bench.percentiles([0.001 * i for i in range(1, 1001)])
    assert s["p50"] == pytest.approx(500e3) and s["p99"] == pytest.approx(990e3) and s["max"] == pytest.approx(1e6)


CPP_BENCH = os.path.join(SOURCE_DIR, "build", "bench", "sweep")


@pytest.mark.skipif(not os.path.exists(CPP_BENCH), reason="build/bench/sweep not built (make build/bench/sweep)")
def test_cpp_bench_sweep(tmp_path):
    out = tmp_path / "bench.jsonl"
    p = subprocess.run([CPP_BENCH, *SWEEP, "--json", str(out)], capture_output=True, text=True, timeout=240,
                       cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(out)
    check_sweep(recs, "c++")


@pytest.mark.skipif(not os.path.exists(CPP_BENCH), reason="build/bench/sweep not built (make build/bench/sweep)")
def test_python_initiator_drives_cpp_target(tmp_path):
    target = subprocess.Popen([CPP_BENCH, "--role", "target", "--idle-seconds", "30"], stdout=subprocess.PIPE,
                              text=True)
    try:
        hello = json.loads(target.stdout.readline())
        assert hello["impl"] == "c++"
        out = tmp_path / "x.jsonl"
        p = subprocess.run([sys.executable, SWEEP_PY, "--role", "initiator", "--target",
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


def test_sweep_a_tent_error_is_one_line_and_exit_status_3(tmp_path):
    p = subprocess.run([sys.executable, SWEEP_PY, "--role", "target", "--listen", "127.0.0.1:99999"],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert p.returncode == 3, p.stdout + p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("sweep.py: error: InvalidArgument: listen address") and "Traceback" not in p.stderr


@pytest.mark.parametrize("args", [["--duration", "nan"], ["--idle-seconds", "inf"], ["--memcpy-seconds", "x"]],
                         ids=lambda a: " ".join(a))
def test_sweep_bad_numbers_are_usage_errors(args, tmp_path):
    p = subprocess.run([sys.executable, SWEEP_PY, *args], capture_output=True, text=True, timeout=60,
                       cwd=str(tmp_path))
    assert p.returncode == 2 and "error: argument" in p.stderr and "Traceback" not in p.stderr, p.stderr


def hide_matplotlib_and_run(args, tmp_path):
    """sweep.py ARGS in a fresh interpreter where `import matplotlib` fails."""
    code = (f"import sys, runpy\nsys.modules['matplotlib'] = None\nsys.argv = {[SWEEP_PY, *args]!r}\n"
            f"runpy.run_path({SWEEP_PY!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(tmp_path))


def test_sweep_plot_without_matplotlib_is_refused_before_the_sweep(tmp_path):
    out, png = tmp_path / "sweep.jsonl", tmp_path / "sweep.png"
    # a sweep that would take minutes if it started
    p = hide_matplotlib_and_run(["--transport", "local,shm", "--op", "write,read", "--block-size", "4K-64M",
                                 "--duration", "30", "--json", str(out), "--plot", str(png)], tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--plot" in p.stderr and "matplotlib is not installed" in p.stderr and "nothing was run" in p.stderr
    assert not out.exists() and not png.exists()  # the JSON file is opened when a sweep starts
    assert p.stdout == ""


def test_sweep_plot_without_matplotlib_refused_when_replaying(tmp_path):
    src = tmp_path / "old.jsonl"
    src.write_text('{"type": "meta", "tool": "sweep", "impl": "python"}\n')
    p = hide_matplotlib_and_run(["--from-json", str(src), "--plot", str(tmp_path / "x.png")], tmp_path)
    assert p.returncode == 2 and "matplotlib is not installed" in p.stderr, p.stderr
    assert p.stdout == ""


# ---- tent-bench: the wheel's small runner ------------------------------------------------------


def tent_bench(args, tmp_path, timeout=120):
    cmd = ["tent-bench"] if shutil.which("tent-bench") else [sys.executable, "-m", "tent", "bench"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path))


def test_tent_bench_every_transport_and_op_checked(tmp_path):
    p = tent_bench(["--transport", "local,shm,tcp", "--op", "write,read", "--block-size", "4K,64K", "--batch", "8",
                    "--duration", "0.05", "--check", "--json"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    points = [json.loads(ln) for ln in p.stdout.splitlines()]
    got = {(r["transport"], r["op"], r["block_size"]) for r in points}
    assert got == {(t, op, b) for t in ("local", "shm", "tcp") for op in OPS for b in BLOCKS}
    for r in points:
        assert r["type"] == "point" and r["check"] == "ok" and r["served_by"] == [r["transport"]], r
        assert r["batches"] >= 1 and r["bytes"] == r["batches"] * 8 * r["block_size"] and r["gbps"] > 0, r
        assert 0 < r["batch_us"]["p50"] <= r["batch_us"]["p99"], r
        assert "problems" not in r, r


def test_tent_bench_table(tmp_path):
    p = tent_bench(["--transport", "local", "--block-size", "4K", "--batch", "4", "--duration", "0.05", "--check"],
                   tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:2] == ["transport", "op"] and len(lines) == 2, p.stdout
    assert lines[1].split()[0] == "local" and lines[1].rstrip().endswith("ok"), p.stdout


def test_tent_bench_bad_arguments(tmp_path):
    p = tent_bench(["--transport", "carrier-pigeon"], tmp_path)
    assert p.returncode == 2 and "choose from local, shm, tcp" in p.stderr, p.stderr
    p = tent_bench(["--block-size", "4Q"], tmp_path)
    assert p.returncode == 2 and "error: argument --block-size" in p.stderr, p.stderr
    p = tent_bench(["--batch", "0"], tmp_path)
    assert p.returncode == 2 and "must be positive" in p.stderr, p.stderr


def build_fake_verbs(tmp_path):
    """The fake libibverbs.so.1 of transport/rdma/fakeverbs, built here the way
    the Go tests build it (gcc, the real library's versioned symbols)."""
    src = os.path.join(SOURCE_DIR, "transport", "rdma", "fakeverbs", "csrc")
    out = tmp_path / "libibverbs.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out), "-Wl,-soname,libibverbs.so.1",
                    "-Wl,--version-script=" + os.path.join(src, "fakeverbs.map"), os.path.join(src, "fakeverbs.c"),
                    "-lpthread"], check=True, capture_output=True, text=True)
    return out


def test_tent_bench_rdma_over_two_fake_nics(tmp_path, monkeypatch):
    """tent-bench --transport rdma against the fake verbs library: two
    processes, two fake NICs, both ops, data checked, served by rdma alone."""
    state = tmp_path / "fakeverbs-state"
    state.mkdir()
    monkeypatch.setenv("TENT_RDMA_VERBS_LIBRARY", str(build_fake_verbs(tmp_path)))
    monkeypatch.setenv("FAKEVERBS_DEVICES", "fake0,fake1")
    monkeypatch.setenv("FAKEVERBS_STATE", str(state))
    monkeypatch.delenv("FAKEVERBS_FAIL", raising=False)
    p = tent_bench(["--transport", "rdma", "--op", "write,read", "--block-size", "4K,1M", "--batch", "8",
                    "--duration", "0.05", "--check", "--json"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    points = [json.loads(ln) for ln in p.stdout.splitlines()]
    got = {(r["op"], r["block_size"]) for r in points}
    assert got == {(op, b) for op in OPS for b in (4096, 1 << 20)}, p.stdout
    for r in points:
        assert r["type"] == "point" and r["transport"] == "rdma" and r["check"] == "ok", r
        assert r["served_by"] == ["rdma"] and r["gbps"] > 0 and "problems" not in r, r


def test_tent_bench_rdma_without_a_device_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("TENT_RDMA_VERBS_LIBRARY", str(build_fake_verbs(tmp_path)))
    monkeypatch.setenv("FAKEVERBS_DEVICES", "0")
    monkeypatch.setenv("FAKEVERBS_STATE", str(tmp_path))
    p = tent_bench(["--transport", "rdma", "--block-size", "4K", "--batch", "2", "--duration", "0.05"], tmp_path)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "rdma" in p.stderr and "no RDMA device" in p.stderr, p.stderr


# ---- the comparison's tcp floor and the comparison itself -----------------------------------

PINGPONG = os.path.join(SOURCE_DIR, "build", "bench", "tcp_pingpong")
COMPARE_PY = os.path.join(SOURCE_DIR, "bench", "compare", "compare.py")


@pytest.mark.skipif(not os.path.exists(PINGPONG), reason="build/bench/tcp_pingpong not built")
def test_tcp_floor_points(tmp_path):
    out = tmp_path / "floor.jsonl"
    p = subprocess.run([PINGPONG, "--op", "write,read", "--block-size", "4K,1M", "--batch", "3", "--threads", "2",
                        "--duration", "0.05", "--span", "2M", "--json", str(out)],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    recs = records(out)
    assert recs[0]["type"] == "meta" and recs[-1] == {"type": "summary", "failures": 0, "target_crashes": 0}
    points = [r for r in recs if r["type"] == "point"]
    assert {(r["op"], r["block_size"]) for r in points} == {(op, b) for op in OPS for b in (4096, 1 << 20)}
    for r in points:
        assert r["threads"] == 2 and r["batch"] == 3 and r["bytes"] == r["batches"] * 3 * r["block_size"], r
        assert r["gbps"] > 0 and 0 < r["batch_us"]["p50"] <= r["batch_us"]["p99"] <= r["batch_us"]["max"], r
    p = subprocess.run([PINGPONG, "--block-size", "4Q"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "bad argument --block-size 4Q" in p.stderr, p.stderr


def test_layouts_cover_the_same_blocks():
    sys.path.insert(0, os.path.dirname(SWEEP_PY))
    import sweep  # bench/sweep/sweep.py

    for block, batch, span, tid in ((4096, 128, 256 << 20, 0), (4096, 128, 256 << 20, 1), (65536, 7, 1 << 20, 0),
                                    (4096, 5, 8192, 0), (4096, 1, 4096, 0)):
        c = sweep.layout(block, batch, span, tid)
        s = sweep.layout(block, batch, span, tid, "shuffled")
        assert sorted(c) == sorted(s) and len(s) == batch
        assert all(b - a == block for a, b in zip(c, c[1:]) if b > a) and c[0] == (tid * batch * block) % span
        if span // block >= batch:  # nothing wraps: no request continues the one before it
            assert not any(b - a == block for a, b in zip(s, s[1:])), s
    with pytest.raises(ValueError):
        sweep.layout(4096, 4, 1 << 20, 0, "diagonal")


def test_sweep_shuffled_layout_moves_the_right_data(tmp_path):
    out = tmp_path / "shuffled.jsonl"
    p = subprocess.run([sys.executable, SWEEP_PY, "--transport", "local,shm", "--op", "write,read", "--block-size", "4K",
                        "--batch", "8", "--duration", "0.05", "--check", "--span", "1M", "--layout", "shuffled",
                        "--no-limits", "--no-progress", "--json", str(out)],
                       capture_output=True, text=True, timeout=240, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    points = [r for r in records(out) if r["type"] == "point"]
    assert len(points) == 4 and all(r["layout"] == "shuffled" and r["check"] == "ok" for r in points), points


@pytest.mark.skipif(not os.path.exists(MEMCPY_FLOOR), reason="build/bench/memcpy_floor not built")
def test_memcpy_floor_limits(tmp_path):
    out = tmp_path / "floor.jsonl"
    p = subprocess.run([MEMCPY_FLOOR, "--block-size", "4K,64K", "--batch", "8", "--threads", "1,2",
                        "--span", "256K", "--seconds", "0.03", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    recs = records(out)
    assert {(r["block_size"], r["threads"]) for r in recs} == {(b, t) for b in (4096, 65536) for t in (1, 2)}
    for r in recs:
        assert r["type"] == "limit" and r["kind"] == "memcpy" and r["impl"] == "c" and r["gbps"] > 0, r
        # the engines' layout: a thread's batch, wrapping within --span
        assert r["span"] == min(r["block_size"] * 8 * r["threads"], 256 << 10), r
    for bad in (["--threads", "0"], ["--threads", "17"], ["--block-size", "4Q"], ["--seconds", "nan"], ["--batch"]):
        p = subprocess.run([MEMCPY_FLOOR, *bad], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "bad argument" in p.stderr, (bad, p.stderr)


@pytest.mark.skipif(not os.path.exists(PINGPONG), reason="build/bench/tcp_pingpong not built")
def test_compare_checks_every_engine_and_measures_the_floor(tmp_path):
    res = tmp_path / "results"
    p = subprocess.run([sys.executable, COMPARE_PY, "--engines", "tent-tcp,tent-shm,tcp-floor", "--runs", "1",
                        "--block-size", "4K", "--batch", "4", "--duration", "0.05", "--iperf3-seconds", "1",
                        "--results", str(res)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((res / "compare.json").read_text())
    # every phase of every engine measured; tent's points all checked, the floor's none
    phases = {(m["engine"], m["phase"]) for m in data["medians"]}
    assert phases == {("tent-tcp", "batch"), ("tent-tcp", "one"), ("tent-tcp", "threads"), ("tent-shm", "batch"),
                      ("tent-shm", "one"), ("tcp-floor", "batch"), ("tcp-floor", "one"), ("tcp-floor", "threads")}
    assert data["checked"] == {"tent-tcp": 6, "tent-shm": 4, "tcp-floor": 0}
    assert data["problems"] == {}
    for raw in (res / "raw").glob("run1-tent-*.jsonl"):
        assert all(r["check"] == "ok" for r in records(raw) if r["type"] == "point"), raw
    md = (res / "compare.md").read_text()
    assert "tent-tcp / tcp-floor WRITE" in md and "A batch of one 4K request" in md
    assert "tent-tcp: 0 crashes, 0 problems, 6 points measured, 6 points checked (CRC-32) and right" in md
    assert "tcp-floor: 0 crashes, 0 problems, 6 points measured, no data check (the floor)" in md


def test_compare_counts_only_checked_points():
    sys.path.insert(0, os.path.dirname(COMPARE_PY))
    try:
        import compare
    finally:
        sys.path.remove(os.path.dirname(COMPARE_PY))

    def point(op, check=None, problems=None):
        rec = {"type": "point", "op": op, "block_size": 4096, "gbps": 1.0, "batch_us": {"p50": 10.0, "p99": 20.0}}
        if check is not None:
            rec["check"] = check
        if problems:
            rec["problems"] = problems
        return rec

    def run(engine, *recs):
        return {"engine": engine, "phase": "batch", "run": 1, "rc": 0, "records": list(recs), "error_lines": []}

    t = compare.Tally([run("tent-tcp", point("WRITE", "ok"), point("READ", "crc32 00000001 != 00000002")),
                       run("nixl-ucx", point("WRITE"), point("READ", "ok", ["served by tcp, not shm"])),
                       run("tcp-floor", point("WRITE"))], ["tent-tcp", "nixl-ucx", "tcp-floor"])
    # only the checked, problem-free point and the floor's point are figures
    assert set(t.figures) == {("tent-tcp", "batch", "WRITE", 4096), ("tcp-floor", "batch", "WRITE", 4096)}
    assert t.checked == {"tent-tcp": 1, "nixl-ucx": 1, "tcp-floor": 0}
    assert t.wrong_data == ["tent-tcp run 1 batch READ 4K: crc32 00000001 != 00000002"]
    assert t.problems["nixl-ucx"] == ["run 1 batch WRITE 4K: data check not done",
                                      "run 1 batch READ 4K: served by tcp, not shm"]
    assert "tcp-floor" not in t.problems
