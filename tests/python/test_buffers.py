"""tent.resolve(): every kind of memory, zero-copy, and the errors for
memory tent cannot use."""

import array
import ctypes
import gc
import mmap
import sys
import types

import numpy as np
import pytest

import tent


def test_bytearray_memoryview_mmap_array_ctypes():
    ba = bytearray(100)
    b = tent.resolve(ba)
    assert b.ptr == ctypes.addressof((ctypes.c_char * 100).from_buffer(ba)) and b.nbytes == 100
    assert not b.readonly and b.device is None

    mv = memoryview(ba)[10:20]
    b = tent.resolve(mv)
    assert b.nbytes == 10 and b.ptr == ctypes.addressof((ctypes.c_char * 100).from_buffer(ba)) + 10

    with mmap.mmap(-1, 8192) as m:
        b = tent.resolve(m)
        assert b.nbytes == 8192
        del b  # releases the export so the mmap can close

    arr = array.array("d", [1.0] * 16)
    assert tent.resolve(arr).nbytes == 128 and tent.resolve(arr).ptr == arr.buffer_info()[0]

    c = (ctypes.c_uint32 * 8)()
    assert tent.resolve(c).ptr == ctypes.addressof(c) and tent.resolve(c).nbytes == 32


def test_readonly_buffers():
    data = b"immutable bytes"
    b = tent.resolve(data)
    assert b.readonly and b.nbytes == len(data)
    assert ctypes.string_at(b.ptr, b.nbytes) == data
    a = np.arange(10, dtype=np.int64)
    a.flags.writeable = False
    assert tent.resolve(a).readonly


def test_numpy_zero_copy_and_contiguity():
    a = np.arange(1000, dtype=np.float32)
    b = tent.resolve(a)
    assert b.ptr == a.ctypes.data and b.nbytes == a.nbytes
    f = np.asfortranarray(np.zeros((4, 5)))
    assert tent.resolve(f).nbytes == f.nbytes  # Fortran order is one contiguous range too
    assert tent.resolve(f).ptr == f.ctypes.data
    with pytest.raises(ValueError):
        tent.resolve(a[::2])
    with pytest.raises(tent.InvalidArgument):
        tent.resolve(np.zeros((4, 4))[:, :2])


class ArrayInterface:
    def __init__(self, arr, **extra):
        self._arr = arr
        self.__array_interface__ = dict(arr.__array_interface__, **extra)


def test_array_interface():
    a = np.arange(64, dtype=np.uint16)
    b = tent.resolve(ArrayInterface(a))
    assert b.ptr == a.ctypes.data and b.nbytes == 128
    strided = a[::2]
    with pytest.raises(tent.InvalidArgument):
        tent.resolve(ArrayInterface(strided))


class CudaArray:
    """A fake device array (CuPy-like): only its interface is read."""

    def __init__(self, ptr, shape, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "strides": strides, "version": 3}


def test_cuda_array_interface_is_device_memory():
    b = tent.resolve(CudaArray(0x7F0000000000, (16, 4)))
    assert b.ptr == 0x7F0000000000 and b.nbytes == 256 and b.device == "cuda"
    with pytest.raises(tent.InvalidArgument):
        tent.resolve(CudaArray(0x7F0000000000, (16, 4), strides=(32, 4)))


def test_dlpack_consumes_the_capsule_and_calls_the_deleter():
    a = np.arange(32, dtype=np.int32)
    before = sys.getrefcount(a)

    class Producer:
        def __dlpack__(self, **kw):
            return a.__dlpack__(**kw)

    b = tent.resolve(Producer())
    assert b.ptr == a.ctypes.data and b.nbytes == 128 and b.device is None
    assert sys.getrefcount(a) > before  # the DLPack tensor holds the array
    owner = b.keepalive
    del b
    owner.release()  # calls the producer's deleter
    gc.collect()
    assert sys.getrefcount(a) == before
    owner.release()  # once only


def test_dlpack_legacy_producer_without_max_version():
    a = np.arange(8, dtype=np.float64)

    class Legacy:
        def __dlpack__(self, stream=None):
            return a.__dlpack__()

    b = tent.resolve(Legacy())
    assert b.ptr == a.ctypes.data and b.nbytes == 64


def test_torch_found_through_sys_modules(monkeypatch):
    fake = types.ModuleType("torch")

    class Device:
        def __init__(self, kind, index=None):
            self.type, self.index = kind, index

    class Tensor:
        def __init__(self, ptr, n, contiguous=True, device=Device("cpu")):
            self._ptr, self._n, self._c, self.device = ptr, n, contiguous, device

        def data_ptr(self):
            return self._ptr

        def numel(self):
            return self._n

        def element_size(self):
            return 2

        def is_contiguous(self):
            return self._c

    fake.Tensor = Tensor
    monkeypatch.setitem(sys.modules, "torch", fake)
    b = tent.resolve(Tensor(0x1000, 10))
    assert (b.ptr, b.nbytes, b.device) == (0x1000, 20, None)
    assert tent.resolve(Tensor(0x2000, 4, device=Device("cuda", 1))).device == "cuda:1"
    with pytest.raises(tent.InvalidArgument):
        tent.resolve(Tensor(0x1000, 10, contiguous=False))


def test_torch_is_never_imported():
    code = "import sys, tent, numpy; tent.resolve(numpy.zeros(4)); print('torch' in sys.modules)"
    from conftest import run_python

    out = run_python(code)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_address_length_pairs():
    assert tent.resolve((0x1000, 64)) == (0x1000, 64, False, None, None)
    for bad in ((0, 64), (-1, 64), (1 << 64, 1), (0x1000, -1), (0x1000, 1 << 64), ((1 << 64) - 8, 16)):
        with pytest.raises(tent.InvalidArgument):
            tent.resolve(bad)
    for bad in ((0x1000,), (0x1000, 1, 2), ("a", 1), (1.5, 2), (True, 3)):
        with pytest.raises(TypeError):
            tent.resolve(bad)


def test_released_closed_and_empty():
    mv = memoryview(bytearray(10))
    mv.release()
    with pytest.raises(ValueError):
        tent.resolve(mv)
    m = mmap.mmap(-1, 4096)
    m.close()
    with pytest.raises(ValueError):
        tent.resolve(m)
    for empty in (bytearray(), b"", np.zeros(0)):
        with pytest.raises(tent.InvalidArgument):
            tent.resolve(empty)


def test_not_memory():
    for obj in (object(), 42, "text", None, [1, 2, 3], 3.5):
        with pytest.raises(TypeError):
            tent.resolve(obj)
