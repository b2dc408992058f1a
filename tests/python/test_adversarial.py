"""Adversarial input to the Python layer: objects whose array interface
lies, waits interrupted by a signal. Each mistake is a TypeError or a
ValueError (tent.InvalidArgument) naming what is wrong, never another
exception from deep inside tent, and never a crash."""

import textwrap

import numpy as np
import pytest

import tent

from conftest import leaks, run_python


class Interface:
    """An object that exports only the __array_interface__ it is given."""

    def __init__(self, iface):
        self.__array_interface__ = iface


class CudaInterface:
    def __init__(self, iface):
        self.__cuda_array_interface__ = iface


_arr = np.zeros(4096, np.uint8)
_good = dict(_arr.__array_interface__)


@pytest.mark.parametrize(
    "iface, exc",
    [
        ([1, 2], TypeError),
        (None, TypeError),
        ("typestr", TypeError),
        ({k: v for k, v in _good.items() if k != "typestr"}, tent.InvalidArgument),
        ({k: v for k, v in _good.items() if k != "shape"}, tent.InvalidArgument),
        (dict(_good, shape=4096), TypeError),
        (dict(_good, shape=None), TypeError),
        (dict(_good, strides="x"), TypeError),
        (dict(_good, data=(1,)), tent.InvalidArgument),
        (dict(_good, data=()), tent.InvalidArgument),
        (dict(_good, data=(_good["data"][0], False, 1)), tent.InvalidArgument),
        (dict(_good, strides=()), tent.InvalidArgument),
        (dict(_good, strides=(1, 1)), tent.InvalidArgument),
        (dict(_good, shape=(64, 64), strides=(1,)), tent.InvalidArgument),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, dict) else None,
)
def test_lying_array_interface_is_a_type_or_value_error(engine, iface, exc):
    for obj in (Interface(iface), CudaInterface(iface)):
        with pytest.raises(exc) as info:
            engine.register(obj)
        assert str(info.value)
    assert leaks(engine) == {}
    # the same memory described truthfully still registers
    with engine.register(Interface(_good)) as r:
        assert r.size == 4096


def test_recv_notification_is_interrupted_by_ctrl_c():
    # A long wait for a notification returns to Python often enough that
    # SIGINT raises KeyboardInterrupt at once, not after the timeout.
    code = textwrap.dedent(
        """
        import os, signal, threading, time
        import tent
        e = tent.Engine(transports="local")
        waiting = threading.Event()
        done = threading.Event()
        # Only the first SIGINT raises: the later ones of the interrupter
        # (sent until it sees done) could otherwise land in the handler.
        fired = []
        def on_sigint(signum, frame):
            if not fired:
                fired.append(signum)
                raise KeyboardInterrupt
        signal.signal(signal.SIGINT, on_sigint)
        def interrupt():
            waiting.wait()
            while not done.is_set():
                os.kill(os.getpid(), signal.SIGINT)
                done.wait(0.05)
        threading.Thread(target=interrupt, daemon=True).start()
        start = time.monotonic()
        try:
            waiting.set()
            e.recv_notification(timeout=120)
            print("returned")
        except KeyboardInterrupt:
            print("interrupted after", round(time.monotonic() - start, 1))
        done.set()
        # the engine still works afterwards
        with e.open_segment(e.name) as s:
            e.notify(s, b"after")
            print(e.recv_notification(timeout=5).message)
        e.close()
        """
    )
    p = run_python(code, timeout=100)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")
    assert lines[0].startswith("interrupted after"), p.stdout
    assert float(lines[0].split()[-1]) < 30, p.stdout
    assert lines[1] == "b'after'", p.stdout


def test_recv_notification_keeps_its_timeout_across_slices(engine):
    # A wait in slices still ends at its timeout, with tent.Timeout.
    with pytest.raises(tent.Timeout):
        engine.recv_notification(timeout=0.45)
    with pytest.raises(tent.Timeout):
        engine.recv_notification(timeout=0)
    with engine.open_segment(engine.name) as s:
        engine.notify(s, b"x" * 10000)  # larger than the first buffer
        n = engine.recv_notification(timeout=5)
        assert n.message == b"x" * 10000 and n.sender == engine.name


def test_registered_array_lives_until_its_region_is_closed(engine, self_segment):
    # del + gc of the caller's last reference does not free registered
    # memory under tent: the region holds it until closed, then lets go.
    import gc
    import weakref

    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros(4096, np.uint8)
    alive = weakref.ref(dst)
    rs, rd = engine.register(src), engine.register(dst)
    addr = rd.addr
    del dst
    gc.collect()
    assert alive() is not None, "freed while registered"
    engine.write(rs, self_segment, addr)
    assert np.array_equal(alive(), src)
    rd.close()
    rs.close()
    gc.collect()
    assert alive() is None, "the region kept the array after close"


def test_close_a_region_while_threads_transfer_with_it(engine, self_segment):
    # Closing a region other threads are using: each transfer succeeds or
    # fails with a tent error; none crashes, nothing is left behind.
    import threading

    buf = np.zeros(1 << 16, np.uint8)
    for _ in range(20):
        r = engine.register(buf[: 1 << 15])
        dst = engine.register(buf[1 << 15:])
        started = threading.Barrier(5)
        errors = []

        def work():
            started.wait()
            for _ in range(200):
                try:
                    engine.write(r, self_segment, dst.addr, length=64)
                except (tent.InvalidHandle, tent.Busy, tent.NotRegistered) as exc:
                    errors.append(type(exc))
                    return
                except Exception as exc:  # noqa: BLE001 - the assertion below names it
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        started.wait()
        while True:
            try:
                r.close()
                break
            except tent.Busy:
                continue
        for t in threads:
            t.join(30)
            assert not t.is_alive()
        assert all(isinstance(e, type) for e in errors), errors
        dst.close()
    assert engine.stats()["regions"] == 0


def test_a_request_list_that_lies_about_its_length(engine, self_segment):
    # len() of a list subclass is the caller's word: past TENT_MAX_BATCH it
    # is InvalidArgument before anything is allocated for it.
    class Huge(list):
        def __len__(self):
            return 10**12

    with engine.register(np.zeros(8192, np.uint8)) as r:
        with pytest.raises(tent.InvalidArgument, match="at most"):
            engine.transfer(Huge([("write", r, self_segment, r.addr + 4096, 16)]))


_DLPACK_PRODUCER = '''
import ctypes
import numpy as np
from tent import _buffers as B

_new = ctypes.pythonapi.PyCapsule_New
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_new.restype = ctypes.py_object
_keep = []
deleted = []

@B._DLDeleter
def _deleter(ptr):
    deleted.append(ptr)

class Producer:
    """A DLPack producer whose tensor says what the test wants."""
    def __init__(self, mem, ndim, shape, bits=8):
        m = B._DLManagedTensor()
        m.dl_tensor.data = mem.ctypes.data
        m.dl_tensor.device = B._DLDevice(1, 0)
        m.dl_tensor.ndim = ndim
        m.dl_tensor.dtype = B._DLDataType(1, bits, 1)
        if shape is not None:
            sh = (ctypes.c_int64 * len(shape))(*shape)
            _keep.append(sh)
            m.dl_tensor.shape = ctypes.cast(sh, ctypes.POINTER(ctypes.c_int64))
        m.deleter = _deleter
        _keep.append(m)
        self.capsule = _new(ctypes.addressof(m), b"dltensor", None)
    def __dlpack__(self, **kw):
        return self.capsule
'''


def test_lying_dlpack_tensor_is_a_value_error(engine):
    ns = {}
    exec(_DLPACK_PRODUCER, ns)
    mem = np.zeros(4096, np.uint8)
    for ndim, shape in ((-1, [4096]), (65, [4096]), (1, None), (1, [-4096])):
        before = len(ns["deleted"])
        with pytest.raises(tent.InvalidArgument):
            engine.register(ns["Producer"](mem, ndim, shape))
        import gc

        gc.collect()
        assert len(ns["deleted"]) == before + 1, "the producer's deleter was not called"
    with engine.register(ns["Producer"](mem, 1, [4096])) as r:
        assert r.size == 4096


def test_dlpack_ndim_far_past_its_shape_does_not_crash():
    # A producer claiming 2**30 dimensions with a one-entry shape array:
    # read as such, the shape runs into unmapped memory.
    code = _DLPACK_PRODUCER + textwrap.dedent(
        """
        import tent
        e = tent.Engine(transports="local")
        mem = np.zeros(4096, np.uint8)
        try:
            e.register(Producer(mem, 1 << 30, [4096]))
        except tent.InvalidArgument as exc:
            print("refused:", exc)
        e.close()
        """
    )
    p = run_python(code)
    assert p.returncode == 0, (p.returncode, p.stderr)
    assert "refused:" in p.stdout and "dimensions" in p.stdout


def test_batch_wait_on_a_stopped_peer_is_interrupted_by_ctrl_c():
    # Batch.wait returns to Python between slices: KeyboardInterrupt (here
    # _thread.interrupt_main, what SIGINT's handler does) ends it long before
    # the batch's deadline, and the batch stays usable.
    import _thread
    import os
    import signal
    import threading
    import time

    from conftest import Peer
    from test_processes import wait_until_stopped

    p = Peer(1 << 16)
    try:
        with tent.Engine(timeout=5) as e:
            seg = e.open_segment(p.name)
            with e.register(np.zeros(1 << 16, np.uint8)) as r:
                e.write(r, seg, p.addr, transport="tcp")  # connections up
                os.kill(p.proc.pid, signal.SIGSTOP)
                wait_until_stopped(p.proc.pid)
                try:
                    b = e.transfer([("read", r, seg, p.addr, 1 << 16)], timeout=8, transport="tcp")
                    waiting, done = threading.Event(), threading.Event()
                    # Interrupts every 50 ms until the wait ends; only the
                    # first raises (a later one could land anywhere).
                    fired = []

                    def on_sigint(signum, frame):
                        if not fired:
                            fired.append(signum)
                            raise KeyboardInterrupt

                    def interrupt():
                        waiting.wait()
                        while not done.is_set():
                            _thread.interrupt_main()
                            done.wait(0.05)

                    before = signal.signal(signal.SIGINT, on_sigint)
                    try:
                        threading.Thread(target=interrupt, daemon=True).start()
                        t0 = time.monotonic()
                        with pytest.raises(KeyboardInterrupt):
                            waiting.set()
                            b.wait()
                    finally:
                        done.set()
                        signal.signal(signal.SIGINT, before)
                    assert time.monotonic() - t0 < 4, "the wait ran on to the batch's deadline"
                    assert not b.done
                    b.close()
                finally:
                    os.kill(p.proc.pid, signal.SIGCONT)
            seg.close()
            assert leaks(e) == {}
    finally:
        p.close()
