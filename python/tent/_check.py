"""Checks of every value this package hands to libtent.so.

ctypes converts silently: an int of 2**64 + x stored in a ``c_void_p`` or
``c_uint64`` becomes x, -1 becomes 2**64 - 1, ``bytes(123)`` is 123 NUL
bytes, and numpy's ``asarray(..., dtype=int64)`` truncates 0.5 to 0. So
each address, offset, length, count, flag, string and byte string passes
through one function here before it reaches a ctypes field or argument:

- a value of the wrong kind (a float, str or bool where an integer goes,
  an int where bytes go) is a ``TypeError``; numpy integers count as
  integers;
- a value of the right kind that C cannot hold, or a range that wraps past
  2**64 or leaves its region, is ``tent.InvalidArgument`` (a ValueError).

Vectorized checks (``u64_array``, ``ranges_fit``) never compute a sum that
could wrap: limits are compared as differences in uint64, or as Python
ints where numpy has no exact type.
"""

from __future__ import annotations

import ctypes
import math
import operator
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

from ._errors import InvalidArgument

U64_END = 1 << 64  # one past the largest address or length C takes

NUMPY_HINT = "pip install 'tent[numpy]'"


def numpy(feature: str) -> Any:
    """The numpy module, or a ModuleNotFoundError that says which feature
    needs it and how to install it."""
    try:
        import numpy as np
    except ModuleNotFoundError as exc:
        if exc.name != "numpy":
            raise
        raise ModuleNotFoundError(f"{feature} needs numpy, which is not installed: {NUMPY_HINT}",
                                  name="numpy") from None
    return np


def numpy_type(name: str) -> Any:
    """numpy's type ``name`` if numpy is imported, else None. Another thread
    may be inside ``import numpy``: its module is then in sys.modules but
    half initialized, and no value of its types can exist yet, so a missing
    attribute means None rather than an AttributeError."""
    np = sys.modules.get("numpy")
    return getattr(np, name, None) if np is not None else None


def is_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    bool_type = numpy_type("bool_")
    return bool_type is not None and isinstance(value, bool_type)


def integer(value: Any, what: str) -> int:
    """value as a Python int: ints and numpy integers pass; bools, floats,
    strings and the rest are a TypeError (never truncated)."""
    if type(value) is int:
        return value
    if not is_bool(value):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{what} must be an int, not {type(value).__name__}")


def u64(value: Any, what: str) -> int:
    """An integer C holds in uint64_t (an address, an offset, a length)."""
    v = integer(value, what)
    if not 0 <= v < U64_END:
        raise InvalidArgument(f"{what} {v:#x} is outside 0..2**64-1" if v >= 0 else f"{what} {v} is negative")
    return v


def bounded(value: Any, what: str, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (a count, a size)."""
    v = integer(value, what)
    if not lo <= v <= hi:
        raise InvalidArgument(f"{what} must be in {lo}..{hi}, not {v}")
    return v


_BITS = {ctypes.c_uint32: 32, ctypes.c_uint64: 64, ctypes.c_void_p: 64}


def struct_values(fields: Any, args: Any, kwargs: Any, what: str) -> Tuple[List[Any], Dict[str, Any]]:
    """Constructor values of a ctypes Structure of unsigned integer and
    pointer fields, checked (each an integer, or None for a NULL pointer,
    within its type) and returned as Python ints, which ctypes stores
    exactly (it refuses numpy integers in pointer fields)."""
    names = [name for name, _ in fields]
    types = dict(fields)
    if len(args) > len(names):
        raise TypeError(f"{what} takes at most {len(names)} values, not {len(args)}")

    def one(name: str, value: Any) -> Any:
        ctype = types.get(name)
        if ctype is None:
            raise TypeError(f"{what} has no field {name!r}")
        if value is None and ctype is ctypes.c_void_p:
            return None
        v = integer(value, f"{what}.{name}")
        if not 0 <= v < 1 << _BITS[ctype]:
            raise InvalidArgument(f"{what}.{name} {v} is outside 0..2**{_BITS[ctype]}-1")
        return v

    return [one(n, v) for n, v in zip(names, args)], {n: one(n, v) for n, v in kwargs.items()}


def span(addr: int, length: int, what: str) -> None:
    """addr..addr+length must end at or before 2**64 (no wrap in C)."""
    if addr + length > U64_END:
        raise InvalidArgument(f"{what}: address {addr:#x} + length {length:#x} runs past 2**64")


def flag(value: Any, what: str) -> bool:
    """A bool (or numpy bool): ``remote_write="no"`` must not mean True."""
    if not is_bool(value):
        raise TypeError(f"{what} must be a bool, not {type(value).__name__}")
    return bool(value)


def cstring(value: Any, what: str) -> Optional[bytes]:
    """None, or a str (UTF-8) / bytes without NUL, for a ``const char *``."""
    if value is None:
        return None
    if isinstance(value, bytes):
        b = value
    elif isinstance(value, str):
        b = utf8(value, what)
    else:
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if b"\0" in b:
        raise InvalidArgument(f"{what} contains a NUL character")
    return b


def utf8(value: str, what: str) -> bytes:
    """A str as UTF-8; one with lone surrogates (from a non-UTF-8 file
    name decoded with surrogateescape) is InvalidArgument."""
    try:
        return value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what} is not valid UTF-8 text ({exc.reason} at position {exc.start})") from None


_FIELD_NAME = re.compile(r":[^:]*:")


def format_holds_objects(fmt: Optional[str]) -> bool:
    """Whether a buffer format (PEP 3118 struct syntax) has an "O" item, a
    PyObject pointer. Field names (":name:") may contain any letter, so
    they are skipped."""
    return "O" in _FIELD_NAME.sub("", fmt or "")


def blob(value: Any, what: str, *, max_len: Optional[int] = None, allow_empty: bool = False) -> bytes:
    """Bytes for a ``const void *, size_t`` pair: a str (UTF-8) or any
    bytes-like object (bytes, bytearray, memoryview, buffer protocol). An
    int or a list is a TypeError, not ``bytes(n)``; memory of Python object
    references (their bytes are heap addresses) is InvalidArgument."""
    if isinstance(value, str):
        b = utf8(value, what)
    else:
        refuse_scalar(value, what)
        try:
            mv = memoryview(value)
        except TypeError:
            raise TypeError(f"{what} must be bytes-like or a str, not {type(value).__name__}") from None
        if format_holds_objects(mv.format):
            raise InvalidArgument(f"{what} holds Python object references (dtype object), not data")
        b = mv.tobytes()
    if not b and not allow_empty:
        raise InvalidArgument(f"{what} is empty")
    if max_len is not None and len(b) > max_len:
        raise InvalidArgument(f"{what} is {len(b)} bytes, at most {max_len}")
    return b


def refuse_scalar(value: Any, what: str) -> None:
    """A TypeError for a numpy scalar where bytes go: numpy exports a
    scalar's bytes (``np.int64(5)`` as 8 bytes), but a number is no
    message or secret, as a Python int is not (``np.bytes_`` is bytes)."""
    generic = numpy_type("generic")
    if generic is not None and isinstance(value, generic) and not isinstance(value, (bytes, str)):
        raise TypeError(f"{what} must be bytes-like or a str, not the numpy scalar {type(value).__name__}")


# Milliseconds the library can turn into a Go duration (int64 ns) safely.
_MAX_MILLIS = (1 << 62) // 1_000_000


def millis(seconds: Any, what: str, *, zero_is_default: bool, inf_ok: bool = False) -> int:
    """Seconds -> milliseconds for the library. None -> 0 (the library's
    default) when zero_is_default, else -1 (the default of a wait). A
    negative or NaN timeout is InvalidArgument; so is infinity unless
    ``inf_ok`` (a wait that ends when the batch does: -1), and so is 0 when
    zero_is_default: the library would read it as its default (30 s for a
    request), not as "at once"."""
    if seconds is None:
        return 0 if zero_is_default else -1
    np_integer, np_floating = numpy_type("integer"), numpy_type("floating")
    numeric = isinstance(seconds, (int, float)) or (
        np_integer is not None and np_floating is not None and isinstance(seconds, (np_integer, np_floating)))
    if is_bool(seconds) or not numeric:
        raise TypeError(f"{what} must be a number of seconds or None, not {type(seconds).__name__}")
    try:
        s = float(seconds)
    except OverflowError:  # an int beyond any float
        raise InvalidArgument(f"{what} of {seconds} s is too large") from None
    if math.isnan(s) or s < 0:
        raise InvalidArgument(f"{what} must be >= 0 seconds, not {seconds}")
    if s == 0 and zero_is_default:
        raise InvalidArgument(f"{what} must be > 0 seconds (None means the default)")
    if math.isinf(s):
        if inf_ok:
            return -1
        raise InvalidArgument(f"{what} must be finite (None means the default)")
    ms = math.ceil(s * 1000)
    if ms > _MAX_MILLIS:
        raise InvalidArgument(f"{what} of {seconds} s is too large")
    if zero_is_default:
        ms = max(ms, 1)  # 0 would mean the default
    return ms


# ---- numpy: many values at once ------------------------------------------------


def u64_array(np: Any, values: Any, what: str) -> Any:
    """values (a sequence, array or scalar of integers) as a 1-d or 0-d
    uint64 array, each checked to be in 0..2**64-1. Floats, bools and
    strings are a TypeError, as in ``integer``."""
    arr = np.asarray(values)
    if arr.dtype.kind == "O":  # ints beyond int64/uint64, or mixed objects: check each in Python
        flat = [u64(v, f"{what} entry") for v in arr.reshape(-1).tolist()]
        return np.array(flat, dtype=np.uint64).reshape(arr.shape)
    if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64
        return arr.astype(np.uint64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, not {arr.dtype} values")
    if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
        raise InvalidArgument(f"{what} must not be negative (found {int(arr.min())})")
    return arr.astype(np.uint64, copy=False)


def ranges_fit(np: Any, offsets: Any, lengths: Any, limit: int) -> Any:
    """Per element: offset + length <= limit, computed without wrapping
    (offsets uint64, lengths uint64 >= 1, 1 <= limit <= 2**64). Returns a
    bool array."""
    top = np.uint64(limit - 1)  # fits even for limit == 2**64
    last = lengths - np.uint64(1)  # lengths >= 1: no underflow
    room = top - np.minimum(last, top)  # no underflow either
    return (last <= top) & (offsets <= room)
