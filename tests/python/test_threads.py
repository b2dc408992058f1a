"""Many Python threads sharing one engine."""

import threading

import numpy as np

import tent

from conftest import leaks

THREADS = 8
ROUNDS = 40


def run_threads(target):
    errors = []
    start = threading.Barrier(THREADS)

    def wrap(i):
        try:
            start.wait()
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((i, exc))

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a thread hung"
    assert not errors, errors


def test_register_transfer_unregister_in_8_threads(engine):
    target = np.zeros(THREADS * 4096, np.uint8)
    with engine.register(target) as rt, engine.open_segment(engine.name) as seg:

        def work(i):
            rng = np.random.default_rng(i)
            for n in range(ROUNDS):
                src = rng.integers(0, 255, 4096, dtype=np.uint8)
                with engine.register(src) as rs:
                    if n % 2:
                        engine.write(rs, seg, rt.addr + i * 4096)
                    else:
                        reqs = tent.make_requests("write", rs, seg, rt.addr + i * 4096,
                                                  local_offsets=np.arange(16) * 256, lengths=256)
                        with engine.transfer(reqs) as b:
                            b.wait(10)
                    assert np.array_equal(target[i * 4096:(i + 1) * 4096], src)
                    back = np.zeros(4096, np.uint8)
                    with engine.register(back) as rb:
                        engine.read(rb, seg, rt.addr + i * 4096)
                    assert np.array_equal(back, src)
                if n % 10 == 0:
                    with engine.alloc(8192) as a:
                        a.view()[:4] = b"abcd"
                    engine.stats()

        run_threads(work)
    assert leaks(engine) == {}


def test_concurrent_overlapping_registrations_one_wins(engine):
    buf = np.zeros(1 << 16, np.uint8)
    for _ in range(10):
        won, lost = [], []
        lock = threading.Lock()

        def work(i):
            try:
                r = engine.register(buf[i * 8:])  # all overlap
                with lock:
                    won.append(r)
            except (tent.Overlap, tent.Busy, tent.AlreadyRegistered) as exc:
                with lock:
                    lost.append(exc)

        run_threads(work)
        assert len(won) == 1 and len(lost) == THREADS - 1
        won[0].close()
    assert leaks(engine) == {}


def test_close_engine_while_threads_use_it():
    e = tent.Engine()
    seg = e.open_segment(e.name)
    buf = np.zeros(1 << 20, np.uint8)
    r = e.register(buf[: 1 << 19])
    r2 = e.register(buf[1 << 19:])
    stop = threading.Event()
    outcomes = []

    def work(i):
        while not stop.is_set():
            try:
                e.write(r, seg, r2.addr)
            except (tent.InvalidHandle, tent.Closed) as exc:
                outcomes.append(type(exc))
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    threading.Timer(0.2, lambda: (e.close(), stop.set())).start()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert e.closed


def test_calls_work_while_another_thread_is_importing_numpy(engine, monkeypatch):
    # While a thread is inside `import numpy`, sys.modules holds a module
    # without its attributes yet; tent's checks must not trip over it.
    import sys
    import types

    monkeypatch.setitem(sys.modules, "numpy", types.ModuleType("numpy"))
    for timeout in (0, 0.01, 0.001):
        try:
            engine.recv_notification(timeout)
        except tent.Timeout:
            pass
    assert tent._check.is_bool(True) and not tent._check.is_bool(1)
    buf = bytearray(4096)
    with engine.register(buf):
        pass
