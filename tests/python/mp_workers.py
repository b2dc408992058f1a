"""Worker functions the multiprocessing tests start (importable by name,
as "spawn" and "forkserver" children need)."""

import hashlib
import os
import sys

import numpy as np

import tent

LEAK_COUNTS = ("regions", "registered_bytes", "reservations", "handles", "segments", "batches",
               "requests_in_flight", "allocations")


def sha(a):
    return hashlib.sha256(memoryview(a).cast("B")).hexdigest()


def numpy_peer(conn, size, transports=None):
    """A peer engine with two targets: a registered numpy array and an
    engine allocation viewed as numpy. Answers commands on conn."""
    with tent.Engine(transports=transports, timeout=20) as e:
        arr = np.zeros(size, np.uint8)
        reg = e.register(arr)
        alloc = e.alloc(size)
        view = alloc.numpy()
        targets = {"registered": arr, "alloc": view}
        conn.send({"name": e.name, "registered": reg.addr, "alloc": alloc.addr, "pid": os.getpid(),
                   "transports": e.transports})
        while True:
            cmd, *args = conn.recv()
            if cmd == "sha":
                conn.send(sha(targets[args[0]]))
            elif cmd == "fill":
                which, seed = args
                targets[which][:] = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
                conn.send(sha(targets[which]))
            elif cmd == "quit":
                del view, targets
                reg.close()
                alloc.close()
                s = e.stats()
                conn.send({k: s[k] for k in LEAK_COUNTS if s[k]})
                return


def spawned_engine_roundtrip(q):
    """Creates an engine and moves bytes in-process; reports the outcome."""
    try:
        with tent.Engine() as e, e.open_segment(e.name) as seg:
            a = np.arange(1024, dtype=np.uint8)
            b = np.zeros_like(a)
            with e.register(a) as ra, e.register(b) as rb:
                e.write(ra, seg, rb.addr)
            q.put(("ok", bool((a == b).all()), "tent" in sys.modules))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent
        q.put(("error", repr(exc), None))


def forked_child_checks(q, engine, region, segment):
    """In a child forked after tent was used: every call raises ForkError
    at once; finalizers of inherited objects raise nothing."""
    import gc
    import time

    unraisable = []
    sys.unraisablehook = lambda u: unraisable.append(repr(u.exc_value))
    results = {}
    start = time.monotonic()
    calls = {
        "Engine()": lambda: tent.Engine(),
        "engine.stats": engine.stats,
        "engine.register": lambda: engine.register(np.zeros(8, np.uint8)),
        "region.info": region.info,
        "region.close": region.close,
        "engine.write": lambda: engine.write(region, segment, region.addr),
        "engine.close": engine.close,
        "tent.topology": tent.topology,
    }
    for name, call in calls.items():
        try:
            call()
            results[name] = "no error"
        except tent.ForkError as exc:
            results[name] = "ForkError" if ("spawn" in str(exc) and "fork" in str(exc)) else f"bad message {exc}"
        except BaseException as exc:  # noqa: BLE001
            results[name] = f"{type(exc).__name__}: {exc}"
    elapsed = time.monotonic() - start
    del engine, region, segment, calls
    gc.collect()
    q.put((results, unraisable, elapsed, tent.version()))
