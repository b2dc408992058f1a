"""One function, ``resolve()``, turns any memory the caller hands tent into
``Buffer(ptr, nbytes, readonly, device, keepalive)``, without copying.

Accepted, in this order:

1. torch tensors, found through ``sys.modules`` (torch is never imported
   here): ``data_ptr()``, ``numel() * element_size()``, ``device``.
2. ``(address, length)`` pairs of ints: raw memory the caller vouches for.
3. ``__cuda_array_interface__`` (CuPy, Numba, ...): device memory; the
   location is left to the library to detect ("cuda:N").
4. The buffer protocol (bytes, bytearray, memoryview, mmap, array.array,
   numpy arrays, ctypes arrays): a memoryview is held, so the exporter can
   neither resize (bytearray) nor close (mmap) the memory while tent uses it.
5. ``__array_interface__`` (numpy-like objects without the buffer protocol,
   and numpy arrays whose dtype it cannot export, e.g. datetime64).
6. ``__dlpack__`` (any DLPack producer): the capsule is consumed (renamed
   "used_dltensor"), the tensor's memory is used in place, and its deleter
   is called when tent lets go of it (``keepalive.release()`` or garbage
   collection). The capsule's struct, shape and strides are read with
   fault-checked copies and the deleter is called only if it lies in
   executable memory, so a producer's garbage pointer is InvalidArgument,
   not a crash. Limits: a CUDA producer is asked for its data on the legacy
   default stream (``stream=None``): synchronize your own stream first.

Non-contiguous memory is a ValueError (``tent.InvalidArgument``); so is an
empty buffer, and so is memory that holds Python object references (a
numpy ``object`` array, a structured dtype with an object field, a ctypes
``py_object`` array): tent moves raw bytes, so a peer could read heap
addresses out of it or write pointers into it that crash the process. A released memoryview or closed mmap raises the ValueError
Python gives for it.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from typing import Any, List, Mapping, NamedTuple, Optional

from . import _check
from ._errors import InvalidArgument


class Buffer(NamedTuple):
    ptr: int
    nbytes: int
    readonly: bool
    device: Optional[str]  # None = host memory; "cuda", "cuda:N" = GPU memory
    keepalive: Any  # hold this while the memory is in use


# ---- CPython buffer access (the pointer of read-only buffers too) ----------


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_PyBUF_ANY_CONTIGUOUS = 0x0080 | 0x0018  # | PyBUF_STRIDES
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def _memoryview_address(mv: memoryview) -> int:
    """The address of a contiguous memoryview's first byte (read-only too).
    The caller keeps ``mv`` alive, which keeps the address valid."""
    if mv.nbytes == 0:
        return 0
    if not mv.readonly and mv.c_contiguous:
        return ctypes.addressof(ctypes.c_char.from_buffer(mv))
    view = _PyBuffer()
    if _get_buffer(mv, ctypes.byref(view), _PyBUF_ANY_CONTIGUOUS) != 0:  # pragma: no cover - raises
        raise BufferError("cannot access the buffer")
    try:
        return int(view.buf or 0)
    finally:
        _release_buffer(ctypes.byref(view))


# ---- Python object references ---------------------------------------------

def _interface_holds_objects(iface: Mapping[str, Any]) -> bool:
    """Whether an array interface's typestr or (nested) descr is "O"."""
    def holds(t: Any) -> bool:
        if isinstance(t, str):
            return t[1:2] == "O"
        if isinstance(t, (list, tuple)):  # descr: [(name, typestr or descr[, shape]), ...]
            return any(holds(f[1]) for f in t if isinstance(f, (list, tuple)) and len(f) >= 2)
        return False

    return holds(iface.get("typestr")) or holds(iface.get("descr"))


def _refuse_objects(what: str) -> Exception:
    return InvalidArgument(
        f"{what} holds Python object references (dtype object): tent moves raw bytes, and a peer that "
        "reads or writes them would see heap addresses or plant pointers that crash the process; "
        "convert the data to a numeric dtype or bytes first"
    )


# ---- DLPack ---------------------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLDeleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DLDeleter),
]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _DLDeleter),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_DLPACK_FLAG_READ_ONLY = 1
_MAX_DLPACK_NDIM = 64
_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13

_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid.restype = ctypes.c_int
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name.restype = ctypes.c_int


class DLPackOwner:
    """Owns a consumed DLPack tensor; ``release()`` (or garbage collection)
    calls the producer's deleter once."""

    __slots__ = ("_ptr", "_deleter", "__weakref__")

    def __init__(self, ptr: int, deleter: Any) -> None:
        self._ptr = ptr
        self._deleter = deleter

    def release(self) -> None:
        ptr, self._ptr = self._ptr, 0
        if ptr and self._deleter:
            self._deleter(ptr)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            pass

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A copy would call the deleter a second time.
        raise TypeError("a consumed DLPack tensor cannot be copied or pickled")


def _contiguous_nbytes(shape: Any, strides: Any, itemsize: int, what: str) -> int:
    """Bytes of an array of shape/strides (strides in bytes, or None for
    C order) that covers one contiguous range (C or Fortran order); raises
    InvalidArgument otherwise."""
    if not isinstance(shape, (tuple, list)) or (strides is not None and not isinstance(strides, (tuple, list))):
        raise TypeError(f"{what}: shape and strides must be tuples of ints, not {shape!r} and {strides!r}")
    shape = [_check.integer(s, f"{what}: a dimension") for s in shape]
    n = 1
    for s in shape:
        if s < 0:
            raise InvalidArgument(f"{what}: negative dimension {s}")
        n *= s
    if strides is None or n == 0:
        return n * itemsize
    strides = [_check.integer(s, f"{what}: a stride") for s in strides]
    if len(strides) != len(shape):
        raise InvalidArgument(f"{what}: {len(strides)} strides for {len(shape)} dimensions")

    def dense(dims: Any) -> bool:
        expect = itemsize
        for dim, stride in dims:
            if dim != 1 and stride != expect:
                return False
            expect *= dim
        return True

    pairs = list(zip(shape, strides))
    if not (dense(reversed(pairs)) or dense(pairs)):
        raise InvalidArgument(f"{what} is not contiguous (shape {tuple(shape)}, strides {tuple(strides)})")
    return n * itemsize


# A DLPack capsule is the producer's word: its tensor struct, the shape and
# strides arrays it points to and its deleter may be garbage. They are read
# with write(2) into a pipe, which answers EFAULT for memory that is not
# there instead of crashing the process, and the deleter is called only if
# it lies in executable memory (the check tent_log_set_callback makes).

_libc = ctypes.CDLL(None, use_errno=True)
_libc_write = _libc.write
_libc_write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
_libc_write.restype = ctypes.c_ssize_t
_PEEK_MAX = 1 << 16  # a pipe's default capacity: one write always fits
_MIN_ADDR = 4096  # the NULL page is never mapped


def _peek(addr: int, n: int, what: str) -> bytes:
    """n (<= 64 KiB) bytes of this process's memory at addr, or
    InvalidArgument naming what if any of them cannot be read."""
    if n == 0:
        return b""
    if not _MIN_ADDR <= addr or addr + n > _check.U64_END:
        raise InvalidArgument(f"{what} is at {addr:#x}: not a valid pointer")
    r, w = os.pipe()
    try:
        done = 0
        while done < n:
            k = _libc_write(w, addr + done, n - done)
            if k <= 0:
                raise InvalidArgument(f"{what}: cannot read the memory it points to (invalid memory at {addr + done:#x})")
            done += k
        chunks = []
        while done:
            c = os.read(r, done)
            chunks.append(c)
            done -= len(c)
        return b"".join(chunks)
    finally:
        os.close(r)
        os.close(w)


def _is_code(addr: int) -> bool:
    """Whether addr lies in an executable mapping of this process (True
    where /proc/self/maps cannot be read)."""
    if addr < _MIN_ADDR:
        return False
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return True
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        lo, _, hi = fields[0].partition("-")
        try:
            if int(lo, 16) <= addr < int(hi, 16):
                return "x" in fields[1]
        except ValueError:
            continue
    return False


def _peek_struct(cls: Any, addr: int, what: str) -> Any:
    return cls.from_buffer_copy(_peek(addr, ctypes.sizeof(cls), what))


def _peek_int64s(addr: int, n: int, what: str) -> List[int]:
    return list((ctypes.c_int64 * n).from_buffer_copy(_peek(addr, 8 * n, what)))


def _from_dlpack(obj: Any) -> Buffer:
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        capsule = obj.__dlpack__()
    versioned = bool(_capsule_is_valid(capsule, b"dltensor_versioned"))
    name = b"dltensor_versioned" if versioned else b"dltensor"
    if not versioned and not _capsule_is_valid(capsule, name):
        raise InvalidArgument("__dlpack__ returned something that is not an unused DLPack capsule")
    ptr = _capsule_get_pointer(capsule, name) or 0
    # Copies, never views: the producer's memory is read once, checked.
    if versioned:
        managed: Any = _peek_struct(_DLManagedTensorVersioned, ptr, "the DLPack capsule's tensor")
        if managed.version.major != 1:
            raise InvalidArgument(f"DLPack version {managed.version.major}.{managed.version.minor} is not supported")
        readonly = bool(managed.flags & _DLPACK_FLAG_READ_ONLY)
    else:
        managed = _peek_struct(_DLManagedTensor, ptr, "the DLPack capsule's tensor")
        readonly = False
    deleter_addr = ctypes.cast(managed.deleter, ctypes.c_void_p).value or 0
    if deleter_addr and not _is_code(deleter_addr):
        # Left unconsumed: calling it would crash the process.
        raise InvalidArgument(f"the DLPack tensor's deleter {deleter_addr:#x} is not in executable memory")
    # Consume it: from now on the deleter is ours to call.
    _capsule_set_name(capsule, b"used_dltensor_versioned" if versioned else b"used_dltensor")
    owner = DLPackOwner(ptr, managed.deleter if deleter_addr else None)
    try:
        return _dlpack_buffer(managed.dl_tensor, readonly, owner)
    except BaseException:
        owner.release()
        raise


def _dlpack_buffer(t: Any, readonly: bool, owner: "DLPackOwner") -> Buffer:
    # ndim is the producer's word, and says how far to read its shape and
    # strides arrays: bounded (numpy's own limit) before they are read.
    if not 0 <= t.ndim <= _MAX_DLPACK_NDIM:
        raise InvalidArgument(f"the DLPack tensor has {t.ndim} dimensions: want 0..{_MAX_DLPACK_NDIM}")
    shape_addr = ctypes.cast(t.shape, ctypes.c_void_p).value or 0
    strides_addr = ctypes.cast(t.strides, ctypes.c_void_p).value or 0
    if t.ndim and not shape_addr:
        raise InvalidArgument(f"the DLPack tensor has {t.ndim} dimensions but no shape")
    shape = _peek_int64s(shape_addr, t.ndim, "the DLPack tensor's shape") if t.ndim else []
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    strides = None
    if strides_addr and t.ndim:
        strides = [s * itemsize for s in _peek_int64s(strides_addr, t.ndim, "the DLPack tensor's strides")]
    nbytes = _contiguous_nbytes(shape, strides, itemsize, "the DLPack tensor")
    kind = t.device.device_type
    if kind in (_kDLCPU, _kDLCUDAHost):
        device = None
    elif kind in (_kDLCUDA, _kDLCUDAManaged):
        device = f"cuda:{t.device.device_id}"
    else:
        raise InvalidArgument(f"DLPack device type {kind} is not supported (want CPU or CUDA memory)")
    return Buffer((t.data or 0) + t.byte_offset, nbytes, readonly, device, owner)


# ---- The one function -------------------------------------------------------


def _typestr_itemsize(typestr: str) -> int:
    """The item size of an array interface typestr ("<u4": 4); a size that
    is not a positive integer ("<u-5") is InvalidArgument, not a negative
    length that C would read as 2**64 - n."""
    digits = re.match(r"[0-9]+", typestr[2:]) if isinstance(typestr, str) else None
    size = int(digits.group()) if digits else 0  # "<M8[ns]": 8
    if size <= 0:
        raise InvalidArgument(f"unsupported typestr {typestr!r}: want a positive item size, e.g. '|u1'")
    return size


def _from_interface(obj: Any, iface: Any, what: str, device: Optional[str]) -> Buffer:
    # The interface is the exporter's word, plain data that may be anything:
    # its shape is checked before a field is used.
    if not isinstance(iface, Mapping):
        raise TypeError(f"{type(obj).__name__}.{what} is a {type(iface).__name__}, not a dict")
    for key in ("typestr", "shape"):
        if key not in iface:
            raise InvalidArgument(f"{type(obj).__name__}.{what} has no {key!r}")
    if iface.get("mask") is not None:
        raise InvalidArgument(f"{what} with a mask is not supported")
    if _interface_holds_objects(iface):
        raise _refuse_objects(f"{type(obj).__name__} ({what})")
    data = iface.get("data")
    if isinstance(data, tuple) and len(data) != 2:
        raise InvalidArgument(f"{what}: data {data!r} is not an (address, read_only) pair")
    if not isinstance(data, tuple):
        if device is None and data is not None:  # array interface with a buffer object
            mv = memoryview(data)
            ptr = _memoryview_address(mv.cast("B") if mv.contiguous else mv)
            readonly, keep = mv.readonly, (obj, mv)
        else:
            raise InvalidArgument(f"{what}: data {data!r} is not an (address, read_only) pair")
    else:
        ptr, readonly = _check.integer(data[0] or 0, f"{what}: the data address"), bool(data[1])
        keep = obj
    ptr += _check.integer(iface.get("offset", 0) or 0, f"{what}: offset")
    itemsize = _typestr_itemsize(iface["typestr"])
    nbytes = _contiguous_nbytes(iface["shape"], iface.get("strides"), itemsize, what)
    return Buffer(ptr, nbytes, readonly, device, keep)


def _from_torch(obj: Any) -> Buffer:
    if not obj.is_contiguous():
        raise InvalidArgument("the torch tensor is not contiguous (call .contiguous() first)")
    dev = obj.device
    device = None if dev.type == "cpu" else (f"cuda:{dev.index or 0}" if dev.type == "cuda" else dev.type)
    if device is not None and not device.startswith("cuda"):
        raise InvalidArgument(f"torch device {dev} is not supported (want cpu or cuda)")
    return Buffer(int(obj.data_ptr()), int(obj.numel()) * int(obj.element_size()), False, device, obj)


def resolve(obj: Any) -> Buffer:
    """Turns obj into a Buffer (see the module documentation). Raises
    TypeError for objects that are no memory at all, InvalidArgument
    (ValueError) for memory tent cannot use (non-contiguous, empty, an
    address or length out of range)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, getattr(torch, "Tensor", ())):
        buf = _from_torch(obj)
    elif isinstance(obj, tuple):
        if len(obj) != 2:
            raise TypeError(f"a memory tuple is (address: int, length: int), not {obj!r}")
        addr = _check.integer(obj[0], "the address of an (address, length) tuple")
        n = _check.integer(obj[1], "the length of an (address, length) tuple")
        if not 0 < addr < 1 << 64:
            raise InvalidArgument(f"address {addr:#x} is not a valid pointer")
        if not 0 <= n < 1 << 63 or addr + n > 1 << 64:
            raise InvalidArgument(f"length {n} is out of range for address {addr:#x}")
        buf = Buffer(addr, n, False, None, None)
    elif hasattr(obj, "__cuda_array_interface__"):
        buf = _from_interface(obj, obj.__cuda_array_interface__, "__cuda_array_interface__", "cuda")
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            mv = None
        except ValueError:
            # numpy exports no buffer for some dtypes (datetime64); its
            # array interface still describes the memory. Anything else
            # (a closed mmap) keeps Python's error.
            if not hasattr(obj, "__array_interface__"):
                raise
            mv = None
        if mv is not None:
            if _check.format_holds_objects(mv.format):
                raise _refuse_objects(type(obj).__name__)
            if not mv.contiguous:
                raise InvalidArgument(f"{type(obj).__name__} is not contiguous: tent needs one contiguous range of memory")
            buf = Buffer(_memoryview_address(mv), mv.nbytes, mv.readonly, None, mv)
        elif hasattr(obj, "__array_interface__"):
            buf = _from_interface(obj, obj.__array_interface__, "__array_interface__", None)
        elif hasattr(obj, "__dlpack__"):
            buf = _from_dlpack(obj)
        else:
            raise TypeError(
                f"{type(obj).__name__} is not memory tent can use: pass an object with the buffer protocol, "
                "__array_interface__, __cuda_array_interface__ or __dlpack__, a torch tensor, "
                "or an (address, length) tuple"
            )
    if buf.nbytes <= 0:  # negative: an exporter's nonsense, which ctypes would wrap
        release(buf.keepalive)
        raise InvalidArgument(f"{type(obj).__name__} is empty: tent needs at least one byte"
                              if buf.nbytes == 0 else f"{type(obj).__name__} claims {buf.nbytes} bytes")
    # Whatever the exporter claims (an interface dict is plain data), the
    # range must be one C can hold: ctypes would wrap 2**64 + x to x.
    if not 0 <= buf.ptr < _check.U64_END or buf.ptr + buf.nbytes > _check.U64_END:
        release(buf.keepalive)
        raise InvalidArgument(f"{type(obj).__name__}: memory at {buf.ptr:#x} + {buf.nbytes} bytes is not an address range")
    return buf


def release(keepalive: Any) -> None:
    """Lets go of a Buffer's keepalive early (a DLPack deleter, a memoryview
    export), instead of waiting for garbage collection."""
    if isinstance(keepalive, DLPackOwner):
        keepalive.release()
    elif isinstance(keepalive, memoryview):
        try:
            keepalive.release()
        except BufferError:  # still exported elsewhere: garbage collection will do it
            pass
