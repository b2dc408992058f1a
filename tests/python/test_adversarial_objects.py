"""Adversarial Python objects: copies and pickles of tent's objects, DLPack
capsules whose pointers are garbage, text that is not UTF-8. Each is a
TypeError or a ValueError (tent.InvalidArgument) naming what is wrong,
never a crash, and never a second owner of a library handle."""

import copy
import gc
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tent

from conftest import run_python


def _objects(engine, self_segment):
    region = engine.register(np.zeros(4096, np.uint8))
    alloc = engine.alloc(4096)
    batch = engine.transfer([("write", region, self_segment, alloc.addr, 64)])
    return region, alloc, batch


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps], ids=["copy", "deepcopy", "pickle"])
def test_handle_owners_cannot_be_copied_or_pickled(engine, self_segment, how):
    # A copy would be a second owner: its finalizer released the handle
    # (the engine itself) under the original.
    region, alloc, batch = _objects(engine, self_segment)
    try:
        for obj in (engine, self_segment, region, alloc, batch):
            with pytest.raises(TypeError, match="cannot be copied or pickled"):
                how(obj)
        gc.collect()
        batch.wait(10)
        assert not engine.closed and not region.closed
        with engine.open_segment(engine.name) as s:  # the engine still answers
            engine.write(region, s, alloc.addr, length=16)
    finally:
        batch.close()
        alloc.close()
        region.close()


_GARBAGE_DLPACK = '''
import ctypes, sys
import numpy as np
import tent
from tent import _buffers as B

_new = ctypes.pythonapi.PyCapsule_New
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_new.restype = ctypes.py_object
mem = np.zeros(4096, np.uint8)
shape = (ctypes.c_int64 * 1)(4096)
kept = []

class Producer:
    def __init__(self, lie):
        self.lie = lie
    def __dlpack__(self, **kw):
        if self.lie == "tensor":
            return _new(8, b"dltensor", None)
        if self.lie == "unmapped-tensor":
            return _new(1 << 47, b"dltensor", None)
        m = B._DLManagedTensor()
        kept.append(m)
        t = m.dl_tensor
        t.data, t.device, t.ndim, t.dtype = mem.ctypes.data, B._DLDevice(1, 0), 1, B._DLDataType(1, 8, 1)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        if self.lie == "shape":
            t.shape = ctypes.cast(ctypes.c_void_p(16), ctypes.POINTER(ctypes.c_int64))
        if self.lie == "strides":
            t.strides = ctypes.cast(ctypes.c_void_p(1 << 47), ctypes.POINTER(ctypes.c_int64))
        if self.lie == "deleter":
            ctypes.memmove(ctypes.addressof(m) + B._DLManagedTensor.deleter.offset,
                           ctypes.byref(ctypes.c_void_p(mem.ctypes.data)), 8)  # data, not code
        return _new(ctypes.addressof(m), b"dltensor", None)

e = tent.Engine(transports="local")
for lie in sys.argv[1:]:
    try:
        e.register(Producer(lie))
        print(lie, "registered")
    except tent.InvalidArgument as exc:
        print(lie, "refused:", exc)
with e.register(Producer("none")) as r:
    print("truthful", r.size)
e.close()
'''


def test_dlpack_capsules_with_garbage_pointers_are_refused():
    # The tensor struct, its shape and strides arrays and its deleter are
    # the producer's word: each garbage pointer is refused, never read or
    # called (each of them used to kill the interpreter with SIGSEGV).
    lies = ["tensor", "unmapped-tensor", "shape", "strides", "deleter"]
    p = subprocess.run([sys.executable, "-c", _GARBAGE_DLPACK, *lies], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    out = dict(line.split(" ", 1) for line in p.stdout.splitlines() if not line.startswith("truthful"))
    assert "truthful 4096" in p.stdout, p.stdout
    assert "tensor" in out["tensor"] and out["tensor"].startswith("refused:"), p.stdout
    for lie in lies:
        assert out[lie].startswith("refused:"), (lie, p.stdout)
    assert "shape" in out["shape"] and "strides" in out["strides"], p.stdout
    assert "executable" in out["deleter"], p.stdout


@pytest.mark.parametrize("call", ["open_segment", "notify", "engine_name"])
def test_text_that_is_not_utf8_is_a_value_error(engine, self_segment, call):
    bad = "peer-\udcff:1"  # what os.fsdecode gives for a non-UTF-8 byte
    with pytest.raises(tent.InvalidArgument, match="not valid UTF-8"):
        if call == "open_segment":
            engine.open_segment(bad)
        elif call == "notify":
            engine.notify(self_segment, bad)
        else:
            tent.Engine(name=bad, transports="local")


def test_open_segment_of_none_is_a_type_error(engine):
    with pytest.raises(TypeError, match="name must be a str"):
        engine.open_segment(None)


def test_dlpack_shape_and_strides_are_read_once_as_given():
    # A truthful tensor whose strides say C order still registers, and a
    # Fortran-ordered 2-d one too (the copies are of the right arrays).
    code = _GARBAGE_DLPACK.split("e = tent.Engine")[0] + textwrap.dedent(
        """
        e = tent.Engine(transports="local")
        m = B._DLManagedTensor()
        t = m.dl_tensor
        sh = (ctypes.c_int64 * 2)(16, 256)
        st = (ctypes.c_int64 * 2)(1, 16)  # Fortran order, in elements
        t.data, t.device, t.ndim, t.dtype = mem.ctypes.data, B._DLDevice(1, 0), 2, B._DLDataType(1, 8, 1)
        t.shape = ctypes.cast(sh, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(st, ctypes.POINTER(ctypes.c_int64))
        class P:
            def __dlpack__(self, **kw):
                return _new(ctypes.addressof(m), b"dltensor", None)
        with e.register(P()) as r:
            print("size", r.size)
        e.close()
        """
    )
    p = run_python(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "size 4096", p.stdout


def test_names_of_bytes_that_are_not_utf8_are_refused(engine):
    # The library refuses them: the name would come back altered (U+FFFD)
    # from Engine.name and stats, and no open_segment could name it.
    with pytest.raises(tent.InvalidArgument, match="not valid UTF-8"):
        tent.Engine(name=b"engine-\xff", transports="local")
    with pytest.raises(tent.InvalidArgument, match="not valid UTF-8"):
        engine.open_segment(b"127.0.0.1\xfe:1")
    with tent.Engine(name="moteur-\u00e9", transports="local") as e:
        assert e.name == "moteur-\u00e9"
        with e.open_segment(e.name) as s:
            e.notify(s, "x")
            assert e.recv_notification(timeout=5).sender == "moteur-\u00e9"


_REENTERING_DELETER = '''
import ctypes, sys
import numpy as np
import tent
from tent import _buffers as B

_new = ctypes.pythonapi.PyCapsule_New
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_new.restype = ctypes.py_object
mem = np.zeros(4096, np.uint8)
shape = (ctypes.c_int64 * 1)(4096)
e = tent.Engine(transports="local")
regions, seen = [], []

@B._DLDeleter
def deleter(ptr):
    # The producer's code, run when tent lets go of its tensor, calls back
    # into tent: the region being closed, the engine's counts, the engine.
    try:
        regions[-1].close()
        seen.append(e.stats()["regions"])
        if sys.argv[1] == "engine":
            e.close()
    except Exception as exc:
        seen.append(type(exc).__name__)

m = B._DLManagedTensor()
t = m.dl_tensor
t.data, t.device, t.ndim, t.dtype = mem.ctypes.data, B._DLDevice(1, 0), 1, B._DLDataType(1, 8, 1)
t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
m.deleter = deleter

class Producer:
    def __dlpack__(self, **kw):
        return _new(ctypes.addressof(m), b"dltensor", None)

regions.append(e.register(Producer()))
regions[-1].close()
print("closed", seen, e.closed)
e.close()
'''


@pytest.mark.parametrize("then", ["stats", "engine"])
def test_a_dlpack_deleter_that_calls_back_into_tent(then):
    # It used to wait forever for the lock its own region's close held.
    p = subprocess.run([sys.executable, "-c", _REENTERING_DELETER, then], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.strip() == f"closed [0] {then == 'engine'}", p.stdout


def test_alloc_location_none_is_cpu(engine):
    # tent_alloc takes NULL as "cpu"; None used to be an AttributeError.
    with engine.alloc(4096, location=None) as a:
        assert a.location == "cpu"
        v = a.view()
        v[:4] = b"abcd"
        assert bytes(v[:4]) == b"abcd"
        v.release()


_WRONG = [None, -1, 0, 2**64, 2**200, 1.5, float("nan"), "x", "\udcff", b"\xff", [], {}, (), (1,), object(),
          np.int64(3), np.float32(1), True, np.array([1, 2]), np.bool_(True), memoryview(b"ab"), bytearray(4)]


def test_every_public_call_with_a_wrong_value_in_each_argument(engine, self_segment):
    # Each argument of each public method and function in turn gets each
    # value of _WRONG, the others a good one: the answer is a result, a
    # TypeError or a ValueError (tent.InvalidArgument and the other tent
    # errors included), never another exception from inside tent.
    import inspect

    mem = np.zeros(1 << 16, np.uint8)
    region = engine.register(mem)
    alloc = engine.alloc(4096)
    batch = engine.transfer([("write", region, self_segment, alloc.addr, 64)])
    good = {"local": region, "segment": self_segment, "remote_addr": alloc.addr, "remote": alloc.addr,
            "length": 64, "requests": [("write", region, self_segment, alloc.addr, 64)], "name": engine.name,
            "obj": mem, "size": 4096, "message": b"m", "timeout": 1, "op": "write", "local_offsets": [0],
            "lengths": [64], "regions": [], "level": "warn"}
    skip = {"close", "uninstall", "unregister_batch"}  # tear down what the sweep uses
    targets = []
    for obj in (engine, self_segment, region, alloc, batch):
        for name, fn in inspect.getmembers(obj, callable):
            if not name.startswith("_") and name not in skip:
                targets.append((f"{type(obj).__name__}.{name}", fn))
    for name in ("make_requests", "topology", "set_log_level", "get_log_level"):
        targets.append((name, getattr(tent, name)))
    level = tent.get_log_level()
    unexpected = []
    try:
        for what, fn in targets:
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            for p in params:
                for value in _WRONG:
                    args = {q.name: good.get(q.name, 1) for q in params if q.default is inspect.Parameter.empty}
                    args[p.name] = value
                    try:
                        r = fn(**args)
                    except (TypeError, ValueError, tent.TentError, BufferError):
                        continue
                    except Exception as exc:  # noqa: BLE001 - collected for the assertion
                        unexpected.append((what, p.name, repr(value)[:30], repr(exc)[:120]))
                        continue
                    if isinstance(r, (tent.Batch, tent.Region, tent.Segment, tent.Engine)):
                        r.close()
    finally:
        tent.set_log_level(level)
        batch.close()
        alloc.close()
        region.close()
    assert unexpected == []


def test_engine_options_with_a_wrong_value_in_each():
    import inspect

    for p in list(inspect.signature(tent.Engine.__init__).parameters.values())[1:]:
        for value in _WRONG + [["local", 5], ("local",)]:
            kw = {p.name: value}
            if p.name != "transports":
                kw["transports"] = "local"
            try:
                tent.Engine(**kw).close()
            except (TypeError, ValueError, tent.TentError):
                pass
