"""Fork, spawn and forkserver scenarios, each run in a fresh interpreter
by test_processes.py (so a hang fails a test instead of hanging it).

Usage: python fork_scenarios.py <scenario>; exit status 0 = passed.
"""

import multiprocessing
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def wait_child(pid, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    check(False, "the forked child hung")


def import_then_fork():
    """import tent, fork before any use: the library is not loaded yet, so
    the child can use tent normally (and so can the parent)."""
    import tent
    from tent import _lib

    check(not _lib.loaded(), "import tent loaded the library")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with tent.Engine() as e:
                with e.alloc(4096) as a:
                    a.view()[:2] = b"ok"
            code = 0
        finally:
            os._exit(code)
    status = wait_child(pid)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}")
    with tent.Engine():
        pass


def fork_after_use():
    """The parent used tent; a multiprocessing "fork" child gets ForkError
    at once from every call, and inherited objects finalize silently."""
    import tent
    import mp_workers

    e = tent.Engine()
    import numpy as np

    buf = np.zeros(4096, np.uint8)
    r = e.register(buf)
    seg = e.open_segment(e.name)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=mp_workers.forked_child_checks, args=(q, e, r, seg))
    p.start()
    results, unraisable, elapsed, version = q.get(timeout=20)
    p.join(20)
    check(p.exitcode == 0, f"child exit code {p.exitcode}")
    bad = {k: v for k, v in results.items() if v != "ForkError"}
    check(not bad, f"calls in the forked child: {bad}")
    check(not unraisable, f"finalizers raised in the child: {unraisable}")
    check(elapsed < 2, f"the calls took {elapsed:.1f} s")
    check(version == tent.__version__, "tent.version() (plain C) should work in the child")
    # the parent is unharmed
    check(r.info().size == 4096, "parent region")
    e.write(r, seg, r.addr)
    seg.close()
    r.close()
    e.close()


def spawn_and_forkserver():
    """The documented way out: "spawn" and "forkserver" workers create
    their own engines, also when the parent used tent."""
    import tent
    import mp_workers

    with tent.Engine():
        for method in ("spawn", "forkserver"):
            ctx = multiprocessing.get_context(method)
            q = ctx.Queue()
            p = ctx.Process(target=mp_workers.spawned_engine_roundtrip, args=(q,))
            p.start()
            result = q.get(timeout=60)
            p.join(30)
            check(result[0] == "ok" and result[1], f"{method} worker: {result}")
            check(p.exitcode == 0, f"{method} worker exit code {p.exitcode}")


def pool_fork_with_unused_import():
    """A multiprocessing.Pool with "fork", in a program that imported tent
    but created nothing: the workers can use tent."""
    import tent  # noqa: F401
    import mp_workers

    ctx = multiprocessing.get_context("fork")
    q = ctx.Manager().Queue()
    with ctx.Pool(2) as pool:
        pool.map(mp_workers.spawned_engine_roundtrip, [q, q])
    for _ in range(2):
        result = q.get(timeout=20)
        check(result[0] == "ok" and result[1], f"pool worker: {result}")


SCENARIOS = {f.__name__: f for f in (import_then_fork, fork_after_use, spawn_and_forkserver,
                                     pool_fork_with_unused_import)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    print("passed")
