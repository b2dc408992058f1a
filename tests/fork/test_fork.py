"""Fork safety of libtent.so, through ctypes only.

The Go runtime inside libtent does not survive fork(): a child that calls
into it hangs. libtent detects the forked child and every call that would
enter Go returns TENT_ERR_FORKED at once, with a message about fork. Each
scenario runs in a fresh interpreter (a subprocess with a timeout), so a
hang fails the test instead of hanging it.

Run with pytest, or as `python3 tests/fork/test_fork.py` (no pytest needed).
Set TENT_LIBRARY to test another build than build/libtent.so.
"""

import ctypes
import multiprocessing
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.environ.get("TENT_LIBRARY", os.path.join(HERE, "..", "..", "build", "libtent.so"))

TENT_OK = 0
TENT_ERR_INVALID_HANDLE = -2
TENT_ERR_FORKED = -16
RW = 3


class RegionDesc(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_void_p), ("len", ctypes.c_size_t), ("location", ctypes.c_char_p)]


class RegionInfo(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("addr", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
        ("location", ctypes.c_char * 32),
    ]


class Stats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("reserved0", ctypes.c_uint32)] + [
        (n, ctypes.c_uint64)
        for n in (
            "regions registered_bytes reservations handles segments batches "
            "requests_in_flight allocations process_handles"
        ).split()
    ]


def load():
    lib = ctypes.CDLL(LIB)
    P, S, U32, U64, VP = ctypes.POINTER, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
    st = ctypes.c_int32
    sigs = {
        "tent_version": (U32, []),
        "tent_status_str": (ctypes.c_char_p, [st]),
        "tent_last_error": (ctypes.c_char_p, []),
        "tent_engine_create": (st, [VP, P(VP)]),
        "tent_engine_destroy": (st, [VP]),
        "tent_engine_name": (st, [VP, ctypes.c_char_p, S, P(S)]),
        "tent_register": (st, [VP, VP, S, ctypes.c_char_p, U32, P(VP)]),
        "tent_register_batch": (st, [VP, P(RegionDesc), S, U32, P(VP)]),
        "tent_unregister": (st, [VP, VP]),
        "tent_unregister_batch": (st, [VP, P(VP), S]),
        "tent_region_get_info": (st, [VP, VP, P(RegionInfo)]),
        "tent_engine_transports": (st, [VP, ctypes.c_char_p, S, P(S)]),
        "tent_uninstall": (st, [VP, ctypes.c_char_p]),
        "tent_engine_stats": (st, [VP, P(Stats)]),
        "tent_engine_stats_json": (st, [VP, ctypes.c_char_p, S, P(S)]),
        "tent_topology_json": (st, [ctypes.c_char_p, S, P(S)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def every_call(lib, engine, region, buf):
    """Calls every function that enters Go; yields (name, status)."""
    out = ctypes.c_void_p()
    n = ctypes.c_size_t()
    text = ctypes.create_string_buffer(256)
    desc = (RegionDesc * 1)(RegionDesc(ctypes.addressof(buf) + 128, 64, None))
    regions = (ctypes.c_void_p * 1)(region)
    info = RegionInfo(size=ctypes.sizeof(RegionInfo))
    stats = Stats(size=ctypes.sizeof(Stats))
    yield "tent_engine_create", lib.tent_engine_create(None, ctypes.byref(out))
    yield "tent_engine_name", lib.tent_engine_name(engine, text, 256, ctypes.byref(n))
    yield "tent_register", lib.tent_register(engine, buf, 64, None, RW, ctypes.byref(out))
    yield "tent_register_batch", lib.tent_register_batch(engine, desc, 1, RW, regions)
    yield "tent_region_get_info", lib.tent_region_get_info(engine, region, ctypes.byref(info))
    yield "tent_engine_transports", lib.tent_engine_transports(engine, text, 256, ctypes.byref(n))
    yield "tent_uninstall", lib.tent_uninstall(engine, None)
    yield "tent_engine_stats", lib.tent_engine_stats(engine, ctypes.byref(stats))
    yield "tent_engine_stats_json", lib.tent_engine_stats_json(engine, text, 256, ctypes.byref(n))
    yield "tent_topology_json", lib.tent_topology_json(text, 256, ctypes.byref(n))
    yield "tent_unregister_batch", lib.tent_unregister_batch(engine, regions, 1)
    yield "tent_unregister", lib.tent_unregister(engine, region)
    yield "tent_engine_destroy", lib.tent_engine_destroy(engine)
    yield "tent_engine_destroy(NULL)", lib.tent_engine_destroy(None)


def fork_and_check(lib, engine, region, buf):
    """Forks; the child makes every call and reports through its exit code."""
    pid = os.fork()
    if pid == 0:
        failures = 0
        start = time.monotonic()
        try:
            for name, st in every_call(lib, engine, region, buf):
                msg = lib.tent_last_error().decode()
                if st != TENT_ERR_FORKED or "fork" not in msg:
                    failures += 1
                    print(f"child: {name} returned {st}: {msg!r}", file=sys.stderr)
            if time.monotonic() - start > 1.0:
                failures += 1
                print("child: the calls took over a second", file=sys.stderr)
        except BaseException as exc:  # report, never return into the parent's code
            print(f"child: {exc!r}", file=sys.stderr)
            failures += 1
        sys.stderr.flush()
        os._exit(min(failures, 100))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}"
            return
        time.sleep(0.005)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung")


def parent_works(lib):
    buf = ctypes.create_string_buffer(4096)
    e, r = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.tent_engine_create(None, ctypes.byref(e)) == TENT_OK
    assert lib.tent_register(e, buf, 4096, b"cpu", RW, ctypes.byref(r)) == TENT_OK, lib.tent_last_error()
    assert lib.tent_unregister(e, r) == TENT_OK
    assert lib.tent_engine_destroy(e) == TENT_OK
    assert lib.tent_last_error() == b""


# ---- Scenarios, each run in a fresh interpreter ---------------------------


def scenario_fork_after_load():
    """Load, then fork before any call into the library."""
    lib = load()
    buf = ctypes.create_string_buffer(4096)
    fork_and_check(lib, None, None, buf)
    parent_works(lib)


def scenario_fork_with_engine():
    lib = load()
    buf = ctypes.create_string_buffer(4096)
    e, r = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.tent_engine_create(None, ctypes.byref(e)) == TENT_OK
    assert lib.tent_register(e, buf, 64, None, RW, ctypes.byref(r)) == TENT_OK
    fork_and_check(lib, e, r, buf)
    stats = Stats(size=ctypes.sizeof(Stats))
    assert lib.tent_engine_stats(e, ctypes.byref(stats)) == TENT_OK
    assert stats.regions == 1
    assert lib.tent_unregister(e, r) == TENT_OK
    assert lib.tent_engine_destroy(e) == TENT_OK
    parent_works(lib)


def _spawned_worker():
    lib = load()
    parent_works(lib)


def _forked_worker(q):
    lib = load()
    e = ctypes.c_void_p()
    st = lib.tent_engine_create(None, ctypes.byref(e))
    q.put((st, lib.tent_last_error().decode()))


def scenario_multiprocessing():
    """The documented way out: "spawn" works; "fork" fails fast."""
    load()
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_spawned_worker)
    p.start()
    p.join(30)
    assert p.exitcode == 0, f"spawned worker exit code {p.exitcode}"

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_forked_worker, args=(q,))
    p.start()
    st, msg = q.get(timeout=10)
    p.join(10)
    assert st == TENT_ERR_FORKED, (st, msg)
    assert "spawn" in msg and "fork" in msg, msg


SCENARIOS = {
    f.__name__: f for f in (scenario_fork_after_load, scenario_fork_with_engine, scenario_multiprocessing)
}


def run_scenario(name):
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), name], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def test_fork_after_load():
    run_scenario("scenario_fork_after_load")


def test_fork_with_engine():
    run_scenario("scenario_fork_with_engine")


def test_multiprocessing_spawn_and_fork():
    run_scenario("scenario_multiprocessing")


if __name__ == "__main__":
    if len(sys.argv) == 2:
        SCENARIOS[sys.argv[1]]()
        sys.exit(0)
    passed = failed = 0
    for test in (test_fork_after_load, test_fork_with_engine, test_multiprocessing_spawn_and_fork):
        try:
            test()
            passed += 1
        except Exception as exc:  # noqa: BLE001 - report every failure
            failed += 1
            print(f"FAILED {test.__name__}: {exc}", file=sys.stderr)
    print(f"test_fork.py: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
