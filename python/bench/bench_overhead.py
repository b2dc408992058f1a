"""Per-call overhead of the Python layer, next to ctypes and C, in one run.

    python python/bench/bench_overhead.py [--iters N] [--batch 128] [--repeat 3] [--json]

Measures, best of --repeat rounds, all against the libtent.so the
installed tent package loads (so C and Python use the same library):

- a plain C call (tent_version) and a call into Go (tent_engine_stats):
  from C, through raw ctypes;
- a synchronous 64-byte local WRITE (one request round trip): from C
  (tent_transfer_sync), raw ctypes with a prebuilt request, and
  ``engine.write(region, segment, addr, 64)``;
- a batch of --batch 64-byte local WRITEs (submit, wait, destroy): from C,
  raw ctypes, and ``with engine.transfer(requests) as b: b.wait()`` with a
  prebuilt ``tent.request_dtype`` array, per batch and per request;
- ``tent.make_requests`` for the batch (vectorized), per request.

The C side is bench_overhead.c, compiled here with the C compiler ($CC or
gcc) against the package's tent.h and libtent.so. The goal: the Python
batch path adds at most 2 us per request over the C path.
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
from typing import Callable, Dict, List

import numpy as np

import tent
from tent import _lib

HERE = os.path.dirname(os.path.abspath(__file__))


def per_call_us(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


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


def run_python(iters: int, batch: int, repeat: int) -> Dict[str, float]:
    dll = _lib.lib()
    res: Dict[str, List[float]] = {}

    def note(k: str, v: float) -> None:
        res.setdefault(k, []).append(v)

    with tent.Engine() as e:
        size = 64 * batch
        src, dst = np.ones(size, np.uint8), np.zeros(size, np.uint8)
        with e.register(src) as rs, e.register(dst) as rd, e.open_segment(e.name) as seg:
            h = e.handle
            stats = _lib.Stats(size=ctypes.sizeof(_lib.Stats))
            one = _lib.Request(tent.WRITE, 0, rs.addr, seg.handle, rd.addr, 64)
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

            def api_write() -> None:
                e.write(rs, seg, rd.addr, 64)

            def build() -> None:
                tent.make_requests("write", rs, seg, rd.addr, local_offsets=offs, lengths=64)

            bi = max(iters // 10, 1)
            for fn, n in ((api_write, iters // 10), (api_batch, bi // 10 + 1), (raw_batch, bi // 10 + 1)):
                for _ in range(n):  # warm up
                    fn()
            for _ in range(repeat):
                note("ctypes_version_call_us", per_call_us(dll.tent_version, iters * 10))
                note("ctypes_stats_call_us", per_call_us(lambda: dll.tent_engine_stats(h, ctypes.byref(stats)), iters))
                note("ctypes_sync_write_us",
                     per_call_us(lambda: dll.tent_transfer_sync(h, ctypes.byref(one), 1, None, None), iters))
                note("api_sync_write_us", per_call_us(api_write, iters))
                note("ctypes_batch_us", per_call_us(raw_batch, bi))
                note("api_batch_us", per_call_us(api_batch, bi))
                note("make_requests_us", per_call_us(build, bi))
            assert np.array_equal(src, dst)
    best = {k: min(v) for k, v in res.items()}
    best["ctypes_batch_per_request_us"] = best["ctypes_batch_us"] / batch
    best["api_batch_per_request_us"] = best["api_batch_us"] / batch
    best["make_requests_per_request_us"] = best["make_requests_us"] / batch
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    c1 = run_c(a.iters, a.batch, a.repeat)
    py = run_python(a.iters, a.batch, a.repeat)
    c2 = run_c(a.iters, a.batch, a.repeat)  # before and after: the C figures bracket the Python ones
    c = {k: min(c1[k], c2[k]) for k in c1} if c1 else {}
    result = {"c": c, "python": py, "batch": a.batch, "iters": a.iters, "repeat": a.repeat,
              "libtent": tent.version(), "library": _lib.loaded_path(), "python_version": sys.version.split()[0]}
    if c:
        result["batch_overhead_per_request_us"] = py["api_batch_per_request_us"] - c["batch_per_request_us"]
        result["goal_met"] = result["batch_overhead_per_request_us"] <= 2.0
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    rows = [
        ("plain C call (tent_version)", c.get("version_call_us"), py["ctypes_version_call_us"], None),
        ("call into Go (tent_engine_stats)", c.get("stats_call_us"), py["ctypes_stats_call_us"], None),
        ("sync 64 B local WRITE", c.get("sync_write_us"), py["ctypes_sync_write_us"], py["api_sync_write_us"]),
        (f"batch of {a.batch} x 64 B WRITE", c.get("batch_us"), py["ctypes_batch_us"], py["api_batch_us"]),
        ("  ... per request", c.get("batch_per_request_us"), py["ctypes_batch_per_request_us"],
         py["api_batch_per_request_us"]),
        (f"make_requests ({a.batch}), per request", None, None, py["make_requests_per_request_us"]),
    ]

    def f(v: object) -> str:
        return f"{v:10.3f}" if isinstance(v, float) else f"{'-':>10}"

    print(f"tent {tent.version()} ({_lib.loaded_path()}), Python {result['python_version']}, "
          f"best of {a.repeat}, microseconds")
    print(f"{'':40} {'C':>10} {'ctypes':>10} {'tent API':>10}")
    for name, cv, ct, api in rows:
        print(f"{name:40} {f(cv)} {f(ct)} {f(api)}")
    if c:
        print(f"Python batch path over C: {result['batch_overhead_per_request_us']:+.3f} us per request "
              f"(goal <= 2 us: {'met' if result['goal_met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
