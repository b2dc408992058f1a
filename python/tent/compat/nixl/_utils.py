"""``nixl._utils``: the raw-memory helpers NIXL's own examples and tests
use (aligned host allocations, a fill pattern, a byte comparison)."""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["ba_buf", "free_passthru", "malloc_passthru", "verify_transfer"]

_ALIGN = 4096  # NIXL's: O_DIRECT storage I/O wants device-block alignment


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.restype = None
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def malloc_passthru(size: int) -> int:
    """size bytes of host memory aligned to 4 KiB (0 when it cannot be had);
    free it with free_passthru."""
    size = int(size)
    if size <= 0:
        return 0
    rounded = (size + _ALIGN - 1) // _ALIGN * _ALIGN  # aligned_alloc wants a multiple
    return int(_libc().aligned_alloc(_ALIGN, rounded) or 0)


def free_passthru(buf: int) -> None:
    _libc().free(int(buf))


def ba_buf(addr: int, size: int) -> None:
    """Fills size bytes at addr with 0xba."""
    ctypes.memset(int(addr), 0xBA, int(size))


def verify_transfer(addr1: int, addr2: int, size: int) -> None:
    """Raises AssertionError unless size bytes at addr1 and addr2 are equal."""
    a, b = ctypes.string_at(int(addr1), int(size)), ctypes.string_at(int(addr2), int(size))
    if a != b:
        first = next(i for i in range(len(a)) if a[i] != b[i])
        raise AssertionError(f"the buffers differ at byte {first}")
