"""Per-call overhead of the Python layer, next to ctypes and C, in one run.

    python bench/overhead/bench_overhead.py [--iters N] [--batch 128] [--repeat 3] [--rounds 2] [--json]

Measures, best of --repeat rounds in each of --rounds Python runs, each
run between two runs of the C side (C, Python, C, Python, C: both see the
same spread of a shared machine's load), all against the libtent.so the
installed tent package loads (so C and Python use the same library):

- a plain C call (tent_version) and a cheap call into Go
  (tent_engine_name): from C, through raw ctypes;
- a synchronous 64-byte local WRITE and READ (one request round trip):
  from C (tent_transfer_sync), raw ctypes with a prebuilt request, and
  ``engine.write(region, segment, addr, 64)`` / ``engine.read(...)``;
- a batch of one 64-byte WRITE (submit, wait, destroy): from C, raw
  ctypes, and ``with engine.transfer(requests) as b: b.wait()`` with a
  prebuilt one-request ``tent.request_dtype`` array;
- the same three one-request calls over shm (two engines of this process
  with only the shm transport; the best of 7 rounds of --iters / 10,
  shm's cost swinging with the machine's load);
  from C also a batch of one through tent_transfer_poll, which the
  Python batch uses (the C figure the goal compares with stays the
  plain tent_transfer + tent_batch_wait + tent_batch_destroy);
- over the same shm engines, a batch of --batch 4 KiB WRITEs into the
  other engine's ``alloc`` memory (which shm maps), with
  ``transport="shm"`` and a timeout as bench/sweep passes them: from C,
  raw ctypes, and ``with engine.transfer(arr, transport="shm",
  timeout=120) as b: b.wait()`` with a prebuilt ctypes array (what
  sweep.py's shm points run); the copy leaves the caches cold for the
  Python code around it, which then costs about twice what it costs
  in the 64-byte local batch;
- a batch of --batch 64-byte local WRITEs (submit, wait, destroy): from C,
  raw ctypes, and ``with engine.transfer(requests) as b: b.wait()`` with a
  prebuilt ``tent.request_dtype`` array, per batch and per request;
- ``tent.make_requests`` for the batch (vectorized), per request.

The C side is bench_overhead.c, compiled here with the C compiler ($CC or
gcc) against the package's tent.h and libtent.so. The goals: the Python
batch path adds at most 2 us per request over the C path, and one request
(engine.write, engine.read, a one-request engine.transfer(...).wait())
at most 3 us over the same call from C. They are judged on process CPU
time (all threads), which a loaded machine distorts far less than wall
time; both are printed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

import tent
from tent import _lib

HERE = os.path.dirname(os.path.abspath(__file__))


def per_call_us(fn: Callable[[], object], n: int) -> Tuple[float, float]:
    """(wall, process CPU) microseconds per call; CPU time counts every
    thread (the Go runtime's too) and is far less distorted by a loaded
    machine than wall time."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6


def run_c(iters: int, batch: int, repeat: int) -> Dict[str, float]:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        return {}
    lib = _lib.loaded_path() or _lib.library_path()
    libdir = os.path.dirname(os.path.abspath(lib))
    include = tent.get_include()
    if not os.path.exists(os.path.join(include, "tent.h")):
        include = os.path.join(HERE, "..", "..", "include")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "bench_overhead")
        subprocess.run([cc, "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-I", include,
                        os.path.join(HERE, "bench_overhead.c"), "-o", exe, os.path.abspath(lib),
                        f"-Wl,-rpath,{libdir}"], check=True)
        best: Dict[str, float] = {}
        for _ in range(repeat):
            out = subprocess.run([exe, str(iters), str(batch)], check=True, capture_output=True, text=True).stdout
            for k, v in json.loads(out).items():
                if k in ("batch", "sink"):
                    continue
                best[k] = min(best.get(k, float("inf")), v)
        return best


# shm's cost swings with the machine's load: its figures are the best of
# at least SHM_ROUNDS rounds of shm_iters calls (bench_overhead.c: the same).
SHM_ROUNDS = 7
# The shm batch's request size and deadline (bench_overhead.c: SHM_BLOCK, SHM_TIMEOUT_MS).
SHM_BLOCK = 4096
SHM_TIMEOUT = 120


def shm_iters(iters: int) -> int:
    return max(iters // 10, 1)


def run_python(iters: int, batch: int, repeat: int) -> Dict[str, float]:
    dll = _lib.lib()
    res: Dict[str, List[float]] = {}

    def note(k: str, v: Tuple[float, float]) -> None:
        res.setdefault(k, []).append(v[0])
        res.setdefault(k.replace("_us", "_cpu_us"), []).append(v[1])

    with tent.Engine() as e:
        size = 64 * batch
        src, dst = np.ones(size, np.uint8), np.zeros(size, np.uint8)
        with e.register(src) as rs, e.register(dst) as rd, e.open_segment(e.name) as seg:
            h = e.handle
            namebuf = ctypes.create_string_buffer(256)
            one = _lib.Request(tent.WRITE, 0, rs.addr, seg.handle, rd.addr, 64)
            one_read = _lib.Request(tent.READ, 0, rd.addr, seg.handle, rs.addr, 64)
            one_req = tent.make_requests("write", rs, seg, rd.addr, local_offsets=[0], lengths=64)
            one_arr = (_lib.Request * 1).from_address(one_req.ctypes.data)
            offs = np.arange(batch) * 64
            reqs = tent.make_requests("write", rs, seg, rd.addr, local_offsets=offs, lengths=64)
            arr = (_lib.Request * batch).from_address(reqs.ctypes.data)
            out = ctypes.c_void_p()

            def raw_batch() -> None:
                assert dll.tent_transfer(h, arr, batch, None, ctypes.byref(out)) == 0
                assert dll.tent_batch_wait(out.value, -1) == 0
                assert dll.tent_batch_destroy(out.value) == 0

            def api_batch() -> None:
                with e.transfer(reqs) as b:
                    b.wait()

            def raw_one_batch() -> None:
                assert dll.tent_transfer(h, one_arr, 1, None, ctypes.byref(out)) == 0
                assert dll.tent_batch_wait(out.value, -1) == 0
                assert dll.tent_batch_destroy(out.value) == 0

            def api_one_batch() -> None:
                with e.transfer(one_req) as b:
                    b.wait()

            def api_write() -> None:
                e.write(rs, seg, rd.addr, 64)

            def api_read() -> None:
                e.read(rd, seg, rs.addr, 64)

            def build() -> None:
                tent.make_requests("write", rs, seg, rd.addr, local_offsets=offs, lengths=64)

            bi = max(iters // 10, 1)
            for fn, n in ((api_write, iters // 10), (api_read, iters // 10), (api_one_batch, iters // 10),
                          (api_batch, bi // 10 + 1), (raw_batch, bi // 10 + 1)):
                for _ in range(n):  # warm up
                    fn()
            for _ in range(repeat):
                note("ctypes_version_call_us", per_call_us(dll.tent_version, iters * 10))
                note("ctypes_go_call_us", per_call_us(lambda: dll.tent_engine_name(h, namebuf, 256, None), iters))
                note("ctypes_sync_write_us",
                     per_call_us(lambda: dll.tent_transfer_sync(h, ctypes.byref(one), 1, None, None), iters))
                note("api_sync_write_us", per_call_us(api_write, iters))
                note("ctypes_sync_read_us",
                     per_call_us(lambda: dll.tent_transfer_sync(h, ctypes.byref(one_read), 1, None, None), iters))
                note("api_sync_read_us", per_call_us(api_read, iters))
                note("ctypes_one_batch_us", per_call_us(raw_one_batch, iters))
                note("api_one_batch_us", per_call_us(api_one_batch, iters))
                note("ctypes_batch_us", per_call_us(raw_batch, bi))
                note("api_batch_us", per_call_us(api_batch, bi))
                note("make_requests_us", per_call_us(build, bi))
            assert np.array_equal(src, dst)
    # The same one-request calls over shm: two engines of this process
    # that have only it (as bench_overhead.c does).
    with tent.Engine(transports="shm") as sa, tent.Engine(transports="shm") as sb:
        ssrc, sdst = np.ones(64, np.uint8), np.zeros(64, np.uint8)
        with sa.register(ssrc) as rs, sb.register(sdst) as rd, sa.open_segment(sb.name) as seg:
            h = sa.handle
            one = _lib.Request(tent.WRITE, 0, rs.addr, seg.handle, rd.addr, 64)
            one_read = _lib.Request(tent.READ, 0, rs.addr, seg.handle, rd.addr, 64)
            one_req = tent.make_requests("write", rs, seg, rd.addr, local_offsets=[0], lengths=64)
            one_arr = (_lib.Request * 1).from_address(one_req.ctypes.data)
            out = ctypes.c_void_p()

            def shm_raw_one_batch() -> None:
                assert dll.tent_transfer(h, one_arr, 1, None, ctypes.byref(out)) == 0
                assert dll.tent_batch_wait(out.value, -1) == 0
                assert dll.tent_batch_destroy(out.value) == 0

            def shm_api_one_batch() -> None:
                with sa.transfer(one_req) as b:
                    b.wait()

            def shm_api_write() -> None:
                sa.write(rs, seg, rd.addr, 64)

            def shm_api_read() -> None:
                sa.read(rs, seg, rd.addr, 64)

            n = shm_iters(iters)
            for fn in (shm_api_write, shm_api_read, shm_api_one_batch, shm_raw_one_batch):
                for _ in range(n // 10):  # warm up
                    fn()
            for _ in range(max(repeat, SHM_ROUNDS)):  # shm swings with the load: more, shorter rounds
                note("ctypes_shm_sync_write_us",
                     per_call_us(lambda: dll.tent_transfer_sync(h, ctypes.byref(one), 1, None, None), n))
                note("api_shm_sync_write_us", per_call_us(shm_api_write, n))
                note("ctypes_shm_sync_read_us",
                     per_call_us(lambda: dll.tent_transfer_sync(h, ctypes.byref(one_read), 1, None, None), n))
                note("api_shm_sync_read_us", per_call_us(shm_api_read, n))
                note("ctypes_shm_one_batch_us", per_call_us(shm_raw_one_batch, n))
                note("api_shm_one_batch_us", per_call_us(shm_api_one_batch, n))
        # batch x 4 KiB into sb's alloc memory, as sweep.py's shm/alloc points
        bsrc = np.ones(SHM_BLOCK * batch, np.uint8)
        with sa.register(bsrc) as brs, sb.alloc(SHM_BLOCK * batch) as brd, sa.open_segment(sb.name) as seg:
            breqs = (_lib.Request * batch)()
            for i in range(batch):
                breqs[i] = _lib.Request(tent.WRITE, 0, brs.addr + SHM_BLOCK * i, seg.handle, brd.addr + SHM_BLOCK * i,
                                        SHM_BLOCK)
            opts = _lib.TransferOptions(size=ctypes.sizeof(_lib.TransferOptions))
            opts.timeout_ms = SHM_TIMEOUT * 1000
            opts.transport = b"shm"
            popts = ctypes.byref(opts)
            h = sa.handle
            out = ctypes.c_void_p()

            def shm_raw_batch() -> None:
                assert dll.tent_transfer(h, breqs, batch, popts, ctypes.byref(out)) == 0
                assert dll.tent_batch_wait(out.value, -1) == 0
                assert dll.tent_batch_destroy(out.value) == 0

            def shm_api_batch() -> None:
                with sa.transfer(breqs, transport="shm", timeout=SHM_TIMEOUT) as b:
                    b.wait()

            n = shm_iters(iters)
            for fn in (shm_raw_batch, shm_api_batch):
                for _ in range(n // 10 + 1):  # warm up: the mapping, the grants
                    fn()
            for _ in range(max(repeat, SHM_ROUNDS)):
                note("ctypes_shm_batch_us", per_call_us(shm_raw_batch, n))
                note("api_shm_batch_us", per_call_us(shm_api_batch, n))
            assert brd.numpy()[0] == 1 and brd.numpy()[-1] == 1
    best = {k: min(v) for k, v in res.items()}
    for kind in ("", "_cpu"):
        best[f"ctypes_batch_per_request{kind}_us"] = best[f"ctypes_batch{kind}_us"] / batch
        best[f"api_batch_per_request{kind}_us"] = best[f"api_batch{kind}_us"] / batch
        best[f"make_requests_per_request{kind}_us"] = best[f"make_requests{kind}_us"] / batch
    return best


# The one-request calls the goal covers, over local and shm.
ONE_REQUEST = ("sync_write", "sync_read", "one_batch", "shm_sync_write", "shm_sync_read", "shm_one_batch")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2, help="Python runs, each between two C runs")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    load_before = os.getloadavg()[0]
    # C, Python, C, ... Python, C: each side gets the same spread of the
    # machine's load (which swings on a shared machine), best of all.
    cs = [run_c(a.iters, a.batch, a.repeat)]
    pys = []
    for _ in range(a.rounds):
        pys.append(run_python(a.iters, a.batch, a.repeat))
        cs.append(run_c(a.iters, a.batch, a.repeat))
    c = {k: min(r[k] for r in cs) for k in cs[0]} if cs[0] else {}
    py = {k: min(r[k] for r in pys) for k in pys[0]}
    result = {"c": c, "python": py, "batch": a.batch, "iters": a.iters, "repeat": a.repeat, "rounds": a.rounds,
              "libtent": tent.version(), "library": _lib.loaded_path(), "python_version": sys.version.split()[0],
              "cpus": os.cpu_count(), "loadavg_1min": [load_before, os.getloadavg()[0]]}
    if c:
        for kind in ("", "_cpu"):
            result[f"batch_overhead_per_request{kind}_us"] = (
                py[f"api_batch_per_request{kind}_us"] - c[f"batch_per_request{kind}_us"])
        result["goal_met"] = result["batch_overhead_per_request_cpu_us"] <= 2.0
        for what in ONE_REQUEST:
            for kind in ("", "_cpu"):
                result[f"{what}_overhead{kind}_us"] = py[f"api_{what}{kind}_us"] - c[f"{what}{kind}_us"]
        result["one_request_goal_met"] = all(result[f"{w}_overhead_cpu_us"] <= 3.0 for w in ONE_REQUEST)
        for kind in ("", "_cpu"):
            result[f"shm_batch_overhead{kind}_us"] = py[f"api_shm_batch{kind}_us"] - c[f"shm_batch{kind}_us"]
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    rows = [
        ("plain C call (tent_version)", "version_call", "ctypes_version_call", None),
        ("call into Go (tent_engine_name)", "go_call", "ctypes_go_call", None),
        ("sync 64 B local WRITE (engine.write)", "sync_write", "ctypes_sync_write", "api_sync_write"),
        ("sync 64 B local READ (engine.read)", "sync_read", "ctypes_sync_read", "api_sync_read"),
        ("batch of 1 x 64 B WRITE (transfer.wait)", "one_batch", "ctypes_one_batch", "api_one_batch"),
        ("  ... C through tent_transfer_poll", "one_batch_poll", None, None),
        ("shm: sync 64 B WRITE (engine.write)", "shm_sync_write", "ctypes_shm_sync_write", "api_shm_sync_write"),
        ("shm: sync 64 B READ (engine.read)", "shm_sync_read", "ctypes_shm_sync_read", "api_shm_sync_read"),
        ("shm: batch of 1 x 64 B WRITE", "shm_one_batch", "ctypes_shm_one_batch", "api_shm_one_batch"),
        ("  ... C through tent_transfer_poll", "shm_one_batch_poll", None, None),
        (f"shm: batch of {a.batch} x 4 KiB WRITE", "shm_batch", "ctypes_shm_batch", "api_shm_batch"),
        (f"batch of {a.batch} x 64 B WRITE", "batch", "ctypes_batch", "api_batch"),
        ("  ... per request", "batch_per_request", "ctypes_batch_per_request", "api_batch_per_request"),
        (f"make_requests ({a.batch}), per request", None, None, "make_requests_per_request"),
    ]

    def cell(d: Dict[str, float], key: object) -> str:
        if key is None or f"{key}_us" not in d:
            return f"{'-':>17}"
        return f"{d[f'{key}_us']:8.3f} {d[f'{key}_cpu_us']:8.3f}"

    print(f"tent {tent.version()} ({_lib.loaded_path()}), Python {result['python_version']}, "
          f"best of {a.repeat} x {a.rounds} rounds; {result['cpus']} CPUs, load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"microseconds per call: wall time, and process CPU time (all threads)")
    print(f"{'':38} {'C (wall, cpu)':>17} {'ctypes (wall, cpu)':>18} {'tent API (wall, cpu)':>20}")
    for name, ck, tk, ak in rows:
        print(f"{name:38} {cell(c, ck)}  {cell(py, tk)}   {cell(py, ak)}")
    if c:
        print(f"Python batch path over C, per request: {result['batch_overhead_per_request_us']:+.3f} us wall, "
              f"{result['batch_overhead_per_request_cpu_us']:+.3f} us CPU "
              f"(goal <= 2 us: {'met' if result['goal_met'] else 'NOT met'})")
        for what, label in (("sync_write", "engine.write"), ("sync_read", "engine.read"),
                            ("one_batch", "one-request transfer().wait()"), ("shm_sync_write", "shm engine.write"),
                            ("shm_sync_read", "shm engine.read"),
                            ("shm_one_batch", "shm one-request transfer().wait()")):
            print(f"Python over C, {label}: {result[f'{what}_overhead_us']:+.3f} us wall, "
                  f"{result[f'{what}_overhead_cpu_us']:+.3f} us CPU")
        print(f"one request: goal <= 3 us CPU over C: {'met' if result['one_request_goal_met'] else 'NOT met'}")
        print(f"Python over C, shm batch of {a.batch} x 4 KiB: {result['shm_batch_overhead_us']:+.3f} us wall, "
              f"{result['shm_batch_overhead_cpu_us']:+.3f} us CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
