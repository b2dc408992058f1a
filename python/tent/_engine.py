"""Engine, Region, AllocatedRegion, Segment and Batch.

Every object that owns a library handle derives from ``_Managed``: ``close()``
is idempotent and thread-safe, objects are context managers (closing on
exit, exceptions included), and ``__del__`` releases what was not closed
without ever raising. In a child forked after libtent was loaded, finalizers
do nothing (the library would answer TENT_ERR_FORKED) and explicit calls
raise ``tent.ForkError``.

Lifetimes: a Region keeps the registered object alive until it is
unregistered (a Region that cannot be unregistered in a finalizer, because
transfers still use it, is parked on its engine with that object until the
engine closes). Children keep their engine alive; closing the engine
releases all of its children in the library, and their ``close()`` becomes
a no-op.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import itertools
import json
import math
import struct
import sys
import threading
import time
import weakref
from ctypes import byref, c_size_t, c_void_p, sizeof
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _check, _lib, _log
from ._buffers import Buffer, release, resolve
from ._errors import (
    BufferTooSmall,
    InvalidArgument,
    InvalidHandle,
    TentError,
    Timeout,
    check,
    error_for,
    fork_error,
)
from ._requests import READ, WRITE, RequestResult, _dtypes, opcode, request_dtype, result_of, segment_handle

_OK = _lib.TENT_OK
_PENDING = _lib.TENT_PENDING
_UNSET = ctypes.c_size_t(-1).value  # an out-parameter the library did not write
# Constant arguments of the untyped calls (_lib.UNTYPED), never modified.
_ONE = ctypes.c_size_t(1)

# ---- helpers ---------------------------------------------------------------


_cstr = _check.cstring


def _read_string(call: Any, initial: int = 256) -> str:
    """Calls call(buf, cap, byref(len)) growing buf on BUFFER_TOO_SMALL."""
    cap = initial
    n = c_size_t()
    while True:
        buf = ctypes.create_string_buffer(cap)
        st = call(buf, cap, byref(n))
        if st == _lib.TENT_ERR_BUFFER_TOO_SMALL and n.value + 1 > cap:
            cap = n.value + 1
            continue
        check(st)
        return buf.raw[: n.value].decode("utf-8", "replace")


def _flags(remote_read: bool, remote_write: bool) -> int:
    read, write = _check.flag(remote_read, "remote_read"), _check.flag(remote_write, "remote_write")
    return (_lib.TENT_REMOTE_READ if read else 0) | (_lib.TENT_REMOTE_WRITE if write else 0)


def _location_arg(location: Optional[str], buf: Buffer) -> Optional[bytes]:
    if location is not None:
        return _cstr(location, "location")
    dev = buf.device
    # "cuda:N" known from DLPack or torch; bare "cuda" (the CUDA array
    # interface) is left to the library to detect.
    if dev is not None and ":" in dev:
        return dev.encode()
    return None


# ---- the managed base -------------------------------------------------------


def _refuse_if_forked(obj: Any) -> None:
    """ForkError in a child forked after libtent was loaded, for a call
    that would take one of obj's locks: another thread of the parent may
    have held it at the fork, and then it stays held here forever."""
    if _lib.forked and obj._handle is not None:
        raise fork_error()


class _Managed:
    """Owns one library handle: idempotent close, context manager, safe
    finalizer."""

    _kind = "object"
    _handle: Optional[int] = None

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def handle(self) -> int:
        """The raw tent.h handle (an int), for requests built by hand."""
        h = self._handle
        if h is None:
            raise InvalidHandle(f"this {self._kind} is closed")
        return h

    def close(self) -> None:
        """Releases the handle; a no-op when already closed."""
        _refuse_if_forked(self)
        with self._lock:
            if self._handle is None:
                return
            self._release()

    def _release(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _finalize(self) -> None:
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._handle is None or _lib.forked or sys.is_finalizing():
                return
            self._finalize()
        except Exception:  # noqa: BLE001 - a finalizer must never raise
            pass

    def __reduce_ex__(self, protocol: Any) -> Any:
        # copy.copy would make a second owner of the handle, whose
        # finalizer releases it under the first; a pickle would name a
        # handle of this process only.
        raise TypeError(f"a tent.{type(self).__name__} owns a library handle of this process: "
                        "it cannot be copied or pickled")


# ---- Engine -----------------------------------------------------------------

_live_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


class Notification(NamedTuple):
    sender: str  # the name its connection gave in the handshake (tent_notify_recv)
    message: bytes


class Engine(_Managed):
    """A tent engine: registers memory, opens peers' segments and moves data.

    All arguments are optional; see ``tent_engine_options`` in tent.h.
    ``transports`` is a list or a comma-separated string in preference
    order (None = every available one); ``secret`` (bytes or str) is the
    shared secret peers must prove; ``timeout`` and ``unregister_timeout``
    are in seconds (None = the library's defaults, 30 s and 5 s; 0 is
    refused, since the library would read it as the default).

    With ``metadata="etcd://..."``, creating the engine, registering,
    unregistering, ``alloc`` and ``free`` return once etcd holds the new
    descriptor, and each wait for etcd lasts at most ``timeout`` or the
    URL's ``dial_timeout`` (default 5 s), whichever is shorter ("Publication"
    in tent.h): an unreachable etcd fails the constructor with
    ``tent.Timeout`` in that time.
    """

    _kind = "engine"

    def __init__(
        self,
        name: Optional[str] = None,
        listen_addr: Optional[str] = None,
        metadata: Optional[str] = None,
        transports: Union[None, str, Sequence[str]] = None,
        secret: Union[None, bytes, str] = None,
        timeout: Optional[float] = None,
        *,
        metadata_prefix: Optional[str] = None,
        unregister_timeout: Optional[float] = None,
        tcp_streams: Optional[int] = None,
    ) -> None:
        super().__init__()
        dll = _lib.lib()
        if transports is not None and not isinstance(transports, (str, bytes)):
            try:
                names = list(transports)
            except TypeError:
                raise TypeError(f"transports must be a str or a sequence of str, not {type(transports).__name__}") from None
            if not all(isinstance(t, str) for t in names):
                raise TypeError("transports must be a str or a sequence of str")
            transports = ",".join(names)
        opts = _lib.EngineOptions(size=sizeof(_lib.EngineOptions))
        opts.name = _cstr(name, "name")
        opts.listen_addr = _cstr(listen_addr, "listen_addr")
        opts.metadata = _cstr(metadata, "metadata")
        opts.metadata_prefix = _cstr(metadata_prefix, "metadata_prefix")
        opts.transports = _cstr(transports, "transports")  # type: ignore[arg-type]
        secret_buf = None
        if secret is not None:
            secret_b = _check.blob(secret, "secret", allow_empty=True)
            if not secret_b:
                raise InvalidArgument("secret is empty: pass None for no secret")
            secret_buf = ctypes.create_string_buffer(secret_b, len(secret_b))
            opts.secret = ctypes.addressof(secret_buf)
            opts.secret_len = len(secret_b)
        opts.timeout_ms = _check.millis(timeout, "timeout", zero_is_default=True)
        self._default_timeout_ms = opts.timeout_ms or _lib.DEFAULT_TIMEOUT_MS
        opts.unregister_timeout_ms = _check.millis(unregister_timeout, "unregister_timeout", zero_is_default=True)
        if tcp_streams is not None:
            opts.tcp_streams = _check.bounded(tcp_streams, "tcp_streams", 1, (1 << 32) - 1)
        _log.on_engine_create()
        h = c_void_p()
        check(dll.tent_engine_create(byref(opts), byref(h)))
        del secret_buf
        self._handle = h.value
        self._name: Optional[str] = None
        # (release function, handle, keepalive) of children whose finalizer
        # could not release them (transfers still running): kept until close.
        self._parked: List[Tuple[str, int, Any]] = []
        self._allocs: "weakref.WeakSet[AllocatedRegion]" = weakref.WeakSet()
        self._request_views = _RequestViews()
        # (timeout, transport) -> the opts argument of transfers without a
        # notify message (_options_arg): built once, never modified after.
        self._options: Dict[Tuple[Any, Any], Any] = {}
        self._calls = dll
        self._fast = _lib.untyped()
        self._handle_arg = c_void_p(self._handle)  # for the untyped calls: never modified
        _live_engines.add(self)

    def __repr__(self) -> str:
        if self._handle is None:
            return "<tent.Engine closed>"
        return f"<tent.Engine {self.name!r}>"

    def _h(self) -> int:
        h = self._handle
        if h is None:
            raise InvalidHandle("the engine is closed")
        return h

    # -- lifetime --

    def close(self) -> None:
        """Destroys the engine: transfers in flight fail, every region,
        segment, batch and allocation of the engine is released, every
        transport uninstalled. Idempotent. Raises BufferError (and stays
        open) while views of its allocations (``AllocatedRegion.view()``)
        are still alive, since they would point at freed memory."""
        _refuse_if_forked(self)
        with self._lock:
            if self._handle is None:
                return
            views = sum(1 for _, _, keep in self._parked if isinstance(keep, _Views) and keep.exported())
            views += sum(1 for a in list(self._allocs) if not a.closed and a._views is not None and a._views.exported())
            if views:
                raise BufferError(
                    f"{views} allocation(s) of this engine still have views (memoryview/numpy) alive: "
                    "release them before closing the engine"
                )
            self._release()

    def _release(self) -> None:
        h, self._handle = self._handle, None
        _live_engines.discard(self)
        self._request_views.clear()  # the arrays may be resized again
        try:
            check(_lib.lib().tent_engine_destroy(h))
        finally:
            self._parked.clear()

    def _park(self, kind: str, handle: int, keepalive: Any) -> None:
        self._parked.append((kind, handle, keepalive))

    # -- identity and state --

    @property
    def name(self) -> str:
        """The engine's segment name (what peers pass to open_segment)."""
        if self._name is None:
            h = self._h()
            self._name = _read_string(lambda b, c, n: _lib.lib().tent_engine_name(h, b, c, n), 128)
        return self._name

    def stats(self) -> Dict[str, Any]:
        """tent_engine_stats and tent_engine_stats_json as one dict: the
        engine's counts (regions, handles, batches, allocations, ...),
        ``transports``: each installed transport's resource counts,
        ``listeners``: each listener's accept-loop counts (accept errors,
        handshake timeouts, evictions, ...), and ``unavailable``: each
        transport asked for that cannot serve on this machine, with the
        reason (``{"cuda": "no CUDA driver ..."}``)."""
        h = self._h()
        dll = _lib.lib()
        s = _lib.Stats(size=sizeof(_lib.Stats))
        check(dll.tent_engine_stats(h, byref(s)))
        out: Dict[str, Any] = json.loads(_read_string(lambda b, c, n: dll.tent_engine_stats_json(h, b, c, n), 1024))
        for field, *_ in _lib.Stats._fields_:
            if field not in ("size", "reserved0"):
                out[field] = getattr(s, field)
        return out

    @property
    def transports(self) -> List[str]:
        """The installed transports, in the order a request tries them
        (tent_engine_transports): only those that can serve here
        (``stats()["unavailable"]`` says why one is missing)."""
        h = self._h()
        names = _read_string(lambda b, c, n: _lib.lib().tent_engine_transports(h, b, c, n), 64)
        return names.split(",") if names else []

    def uninstall(self, name: Optional[str] = None) -> None:
        """Uninstalls one transport, or all of them (None)."""
        check(_lib.lib().tent_uninstall(self._h(), _cstr(name, "name")))

    # -- memory --

    def register(
        self,
        obj: Any,
        location: Optional[str] = None,
        remote_read: bool = True,
        remote_write: bool = True,
    ) -> "Region":
        """Registers obj's memory (anything ``tent`` accepts as memory: the
        buffer protocol, numpy/CuPy/torch arrays, DLPack, ``(addr, len)``)
        and returns its Region, which keeps obj alive until unregistered.
        ``location`` ("cpu", "cpu:N", "cuda:N") is detected when None."""
        h = self._h()
        buf = resolve(obj)
        try:
            if buf.readonly and remote_write:
                raise InvalidArgument(
                    f"{type(obj).__name__} is read-only: register it with remote_write=False"
                )
            out = c_void_p()
            check(
                _lib.lib().tent_register(
                    h, buf.ptr, buf.nbytes, _location_arg(location, buf), _flags(remote_read, remote_write), byref(out)
                )
            )
        except BaseException:
            release(buf.keepalive)
            raise
        return Region(self, out.value, buf)  # type: ignore[arg-type]

    def register_batch(
        self,
        objs: Iterable[Any],
        location: Optional[str] = None,
        remote_read: bool = True,
        remote_write: bool = True,
    ) -> List["Region"]:
        """Registers many objects at once, all or none. Each item is an
        object or an ``(object, location)`` pair."""
        h = self._h()
        bufs: List[Buffer] = []
        locs: List[Optional[bytes]] = []
        try:
            for item in objs:
                loc = location
                if isinstance(item, tuple) and len(item) == 2 and (item[1] is None or isinstance(item[1], str)):
                    item, loc = item
                buf = resolve(item)
                bufs.append(buf)
                if buf.readonly and remote_write:
                    raise InvalidArgument(
                        f"item {len(bufs) - 1} ({type(item).__name__}) is read-only: register it with remote_write=False"
                    )
                locs.append(_location_arg(loc, buf))
            n = len(bufs)
            if n == 0:
                return []
            descs = (_lib.RegionDesc * n)()
            for i, (buf, cloc) in enumerate(zip(bufs, locs)):
                descs[i].addr = buf.ptr
                descs[i].len = buf.nbytes
                descs[i].location = cloc
            out = (c_void_p * n)()
            check(_lib.lib().tent_register_batch(h, descs, n, _flags(remote_read, remote_write), out))
        except BaseException:
            for buf in bufs:
                release(buf.keepalive)
            raise
        return [Region(self, out[i], buf) for i, buf in enumerate(bufs)]  # type: ignore[arg-type]

    def unregister_batch(self, regions: Sequence["Region"]) -> None:
        """Unregisters many regions at once, all or none."""
        h = self._h()
        if _lib.forked:
            raise fork_error()  # before the regions' locks (see _refuse_if_forked)
        regions = list(regions)
        if not regions:
            return
        first: Dict[int, int] = {}
        for i, r in enumerate(regions):
            if not isinstance(r, Region) or isinstance(r, AllocatedRegion):
                raise TypeError("unregister_batch takes registered Regions (free allocations with close())")
            if r._engine is not self:
                raise InvalidHandle(f"region {i} belongs to another engine")
            j = first.setdefault(id(r), i)
            if j != i:  # its lock would be taken twice: a deadlock, not an error
                raise InvalidArgument(f"regions {j} and {i} are the same region")
        # One lock order for every caller, so that two batches listing the
        # same regions in different orders cannot wait for each other.
        locks = [r._lock for r in sorted(regions, key=id)]
        for lock in locks:
            lock.acquire()
        try:
            arr = (c_void_p * len(regions))()
            for i, r in enumerate(regions):
                arr[i] = r.handle
            check(_lib.lib().tent_unregister_batch(h, arr, len(regions)))
            for r in regions:
                r._handle = None
                r._drop()
        finally:
            for lock in locks:
                lock.release()

    def alloc(
        self, size: int, location: Optional[str] = "cpu", remote_read: bool = True, remote_write: bool = True
    ) -> "AllocatedRegion":
        """Allocates and registers size bytes at location. Host memory is
        shared memory same-host peers map directly when both remote_read
        and remote_write are set (a shared mapping would grant both;
        otherwise they copy with process_vm); ``.view()`` and
        ``.numpy()`` give zero-copy access to it. Freed by ``close()``."""
        h = self._h()
        if location is None:  # as in tent_alloc: NULL is "cpu"
            location = "cpu"
        size = _check.integer(size, "size")
        if not 0 < size < 1 << 63:
            raise InvalidArgument(f"size must be positive (and below 2**63), not {size}")
        addr, out = c_void_p(), c_void_p()
        check(
            _lib.lib().tent_alloc(
                h, size, _cstr(location, "location"), _flags(remote_read, remote_write), byref(addr), byref(out)
            )
        )
        try:
            region = AllocatedRegion(self, out.value, addr.value, size, location)  # type: ignore[arg-type]
        except BaseException:
            _lib.lib().tent_free(h, out.value)  # nothing may own an allocation nobody can close
            raise
        self._allocs.add(region)
        return region

    # -- peers --

    def open_segment(self, name: Union[str, "Engine"]) -> "Segment":
        """Opens a peer's segment by name (an Engine: its name; this
        engine's own name opens itself)."""
        h = self._h()
        if isinstance(name, Engine):
            name = name.name
        if name is None:
            raise TypeError("name must be a str, not NoneType")
        out = c_void_p()
        cname = _cstr(name, "name")
        check(_lib.lib().tent_segment_open(h, cname, byref(out)))
        shown = name if isinstance(name, str) else (cname or b"").decode("utf-8", "replace")
        return Segment(self, out.value, shown)  # type: ignore[arg-type]

    # -- transfers --

    def _local(self, local: Any, into: bool) -> Tuple[int, int, Any]:
        """(address, length, keepalive) of the local side of a transfer."""
        if type(local) in _REGION_TYPES:  # the common case, without the checks below
            if local._handle is None:
                raise InvalidHandle("this region is closed")
            if into and local.readonly:
                raise InvalidArgument("the region is read-only memory: it cannot be the destination of a read")
            return local.addr, local.size, local
        if isinstance(local, Region) or (isinstance(local, tuple) and len(local) == 2 and isinstance(local[0], Region)):
            region, offset = (local, 0) if isinstance(local, Region) else local
            region.handle  # raises InvalidHandle if it was closed
            if into and region.readonly:
                raise InvalidArgument("the region is read-only memory: it cannot be the destination of a read")
            offset = _check.integer(offset, "the offset of a (Region, offset) pair")
            if not 0 <= offset < region.size:
                raise InvalidArgument(f"offset {offset} is outside the region ({region.size} bytes)")
            return region.addr + offset, region.size - offset, region
        buf = resolve(local)
        if buf.readonly and into:
            raise InvalidArgument(f"{type(local).__name__} is read-only: it cannot be the destination of a read")
        return buf.ptr, buf.nbytes, buf.keepalive

    def _transfer_options(
        self, timeout: Optional[float], notify: Any, transport: Optional[str]
    ) -> Tuple[Optional[_lib.TransferOptions], Any]:
        """(tent_transfer_options or None for defaults, keepalive)."""
        if timeout is None and notify is None and transport is None:
            return None, None
        opts = _lib.TransferOptions(size=sizeof(_lib.TransferOptions))
        opts.timeout_ms = _check.millis(timeout, "timeout", zero_is_default=True)
        keep = None
        if notify is not None:
            msg = _check.blob(notify, "notify", max_len=_lib.MAX_NOTIFY_LEN, allow_empty=True)
            if msg:
                keep = ctypes.create_string_buffer(msg, len(msg))
                opts.notify = ctypes.addressof(keep)
                opts.notify_len = len(msg)
        opts.transport = _cstr(transport, "transport")
        return opts, keep

    _MAX_OPTIONS = 32  # distinct (timeout, transport) pairs remembered per engine

    def _options_arg(self, timeout: Optional[float], notify: Any, transport: Optional[str]) -> Tuple[Any, Any]:
        """(the opts argument of a transfer call: None or a pointer to its
        tent_transfer_options, keepalive). Options without a notify message
        are the same for every call with the same timeout and transport,
        and the library only reads them during the call: they are built
        once per engine and reused (building them costs as much as the rest
        of a batch's Python path). Only plain ints, floats and strs are
        remembered: a bool or a subclass always takes the checks."""
        if notify is None and type(timeout) in _PLAIN_TIMEOUTS and type(transport) in _PLAIN_TRANSPORTS:
            key = (timeout, transport)
            arg = self._options.get(key)
            if arg is None:
                opts, _ = self._transfer_options(timeout, None, transport)
                arg = byref(opts) if opts is not None else None
                if len(self._options) >= self._MAX_OPTIONS:
                    self._options.clear()
                self._options[key] = arg
            return arg, None
        opts, keep = self._transfer_options(timeout, notify, transport)
        return (byref(opts) if opts is not None else None), keep

    def _sync(
        self,
        op: int,
        local: Any,
        segment: "Segment",
        remote_addr: int,
        length: Optional[int],
        timeout: Optional[float],
        transport: Optional[str],
    ) -> RequestResult:
        # The checks are written out for plain ints and Segments, the common
        # case: every call of a one-request transfer pays for them.
        h = self._handle
        if h is None:
            h = self._h()  # raises
        if type(segment) is not Segment and not isinstance(segment, Segment):
            raise TypeError(f"segment must be a Segment (from open_segment), not {type(segment).__name__}")
        if type(local) in _REGION_TYPES and local._handle is not None and (op != READ or not local.readonly):
            addr, n, keep = local.addr, local.size, local  # _local's fast path, without the call
        else:
            addr, n, keep = self._local(local, op == READ)
        if length is None:
            length = n
        else:
            if type(length) is not int:
                length = _check.integer(length, "length")
            if not 0 < length <= n:
                raise InvalidArgument(f"length {length} is not within the local memory's {n} bytes")
        if type(remote_addr) is not int or not 0 <= remote_addr < _check.U64_END:
            remote_addr = _check.u64(remote_addr, "remote_addr")
        if remote_addr + length > _check.U64_END:
            _check.span(remote_addr, length, "remote range")
        seg = segment._handle
        if seg is None:
            seg = segment.handle  # raises
        if timeout is None and transport is None:
            opts = okeep = None
        else:
            opts, okeep = self._options_arg(timeout, None, transport)
        # One request and one status struct per thread, reused (the call is
        # synchronous): cheaper than allocating both per call. Taken out
        # while in use, so a re-entrant call (a finalizer) gets its own.
        cache = _sync_bufs.__dict__
        bufs = cache.pop("v", None) or _SyncBufs()
        try:
            _REQUEST_LAYOUT.pack_into(bufs.req, 0, op, 0, addr, seg, remote_addr, length)
            st = bufs.call(self._handle_arg, bufs.preq, _ONE, opts, bufs.pstatus)
            del keep, okeep
            if st < 0:
                check(st)
            return bufs.result()
        finally:
            cache["v"] = bufs

    def write(
        self,
        local: Any,
        segment: "Segment",
        remote_addr: int,
        length: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
        transport: Optional[str] = None,
    ) -> RequestResult:
        """Writes local memory to ``remote_addr`` in the peer's segment and
        waits. ``local`` is a Region, a ``(Region, offset)`` pair, a
        registered buffer object or an ``(address, length)`` pair; length
        defaults to all of it. Returns the request's result (which
        transport served it); raises the request's error on failure."""
        return self._sync(WRITE, local, segment, remote_addr, length, timeout, transport)

    def read(
        self,
        local: Any,
        segment: "Segment",
        remote_addr: int,
        length: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
        transport: Optional[str] = None,
    ) -> RequestResult:
        """Reads from ``remote_addr`` in the peer's segment into local
        memory and waits (see ``write``)."""
        return self._sync(READ, local, segment, remote_addr, length, timeout, transport)

    def transfer(
        self,
        requests: Any,
        timeout: Optional[float] = None,
        notify: Union[None, bytes, str] = None,
        transport: Optional[str] = None,
    ) -> "Batch":
        """Submits many requests at once and returns their Batch at once.

        ``requests`` is one contiguous array of tent_request: a numpy
        structured array of ``tent.request_dtype`` (see
        ``tent.make_requests``), a ctypes array of ``tent.Request``, or, for
        convenience (a Python loop), a sequence of ``(op, local_addr,
        segment, remote_addr, length)`` tuples. ``notify`` is delivered to
        each target after all of the batch's data arrived; ``transport``
        ("local", "shm", "tcp", "cuda") is a hint; ``timeout`` (seconds,
        > 0) is the requests' deadline, None the engine's default.

        The engine remembers, weakly, the numpy request arrays it
        transferred (the same array transferred again costs less); numpy
        refuses to resize such an array in place (``ndarray.resize``)
        until it or the engine is gone.
        """
        h = self._handle
        if h is None:
            h = self._h()  # raises
        seen = self._request_views.get(id(requests))
        if seen is not None and seen[0]() is requests:
            _, arr, n, narg = seen
            if arr is None:
                arr = requests
        else:
            arr, n, _ = _request_array(requests, self._request_views)
            narg = _ONE if n == 1 else c_size_t(n)
        if timeout is None and notify is None and transport is None:
            opts = okeep = None
        else:
            # _options_arg's remembered options, looked up here (a call less
            # a batch); anything else takes it.
            opts = okeep = None
            if notify is None and type(timeout) in _PLAIN_TIMEOUTS and type(transport) in _PLAIN_TRANSPORTS:
                opts = self._options.get((timeout, transport))
            if opts is None:
                opts, okeep = self._options_arg(timeout, notify, transport)
        out = c_void_p()
        # Submits and reports the batch's state at once: a transfer already
        # finished (small local and shm ones often are) needs no wait call.
        st = self._fast.tent_transfer_poll(self._handle_arg, arr, narg, opts, byref(out))
        del okeep
        bh = out.value
        if bh is None:  # the call failed: nothing was submitted
            check(st if st < 0 else _lib.TENT_ERR_INTERNAL)
        # A failed request is wait()'s to raise. out (a c_void_p) is the
        # batch handle's argument for the untyped calls.
        return Batch(self, bh, n, st == _OK, out)  # type: ignore[arg-type]

    # -- notifications --

    def notify(self, segment: "Segment", message: Union[bytes, str, Any]) -> None:
        """Sends a message (at most 64 KiB) to the segment's engine, after
        every batch this engine already completed to it."""
        h = self._h()
        if not isinstance(segment, Segment):
            raise TypeError(f"segment must be a Segment, not {type(segment).__name__}")
        msg = _check.utf8(message, "message") if isinstance(message, str) else message
        if isinstance(msg, bytes):
            check(_lib.lib().tent_notify_send(h, segment.handle, msg, len(msg)))
            return
        _check.refuse_scalar(msg, "message")
        buf = resolve(msg)
        try:
            check(_lib.lib().tent_notify_send(h, segment.handle, buf.ptr, buf.nbytes))
        finally:
            release(buf.keepalive)

    def recv_notification(self, timeout: Optional[float] = None) -> Notification:
        """Receives the oldest notification as ``(sender, message)``,
        waiting up to timeout seconds (None: the engine's default timeout;
        0: do not wait). Raises tent.Timeout when none arrives."""
        h = self._h()
        ms = _check.millis(timeout, "timeout", zero_is_default=False)
        if ms < 0:
            ms = self._default_timeout_ms
        dll = _lib.lib()
        # A sender name always fits TENT_MAX_NAME_LEN + 1 bytes; only the
        # message may need a second try, with its reported length.
        cap, from_cap = 4096, _lib.TENT_MAX_NAME_LEN + 1
        n = c_size_t()
        sender = ctypes.create_string_buffer(from_cap)
        # The wait returns to Python at least every slice, so a signal
        # (Ctrl-C) is handled while waiting, not after the whole timeout.
        end = time.monotonic() + ms / 1000
        step = min(ms, Batch._WAIT_SLICE_MS)
        while True:
            buf = ctypes.create_string_buffer(cap)
            st = dll.tent_notify_recv(h, step, buf, cap, byref(n), sender, from_cap)
            if st == _lib.TENT_ERR_BUFFER_TOO_SMALL and n.value > cap:
                cap = n.value
                continue
            if st == _lib.TENT_ERR_TIMEOUT:
                left = end - time.monotonic()
                if left > 0:
                    step = min(math.ceil(left * 1000), Batch._WAIT_SLICE_MS)
                    continue
            check(st)
            return Notification(sender.value.decode("utf-8", "replace"), buf.raw[: n.value])


_sync_bufs = threading.local()


class _SyncBufs:
    """One thread's request and status structs for tent_transfer_sync, the
    function itself, and the results already built: a RequestResult is
    immutable, so equal statuses share one (building it is most of the
    Python cost of a one-request transfer)."""

    __slots__ = ("req", "status", "preq", "pstatus", "call", "results")
    _MAX_RESULTS = 64  # distinct (code, transport, bytes, flags) kept per thread

    def __init__(self) -> None:
        self.req, self.status = _lib.Request(), _lib.RequestStatus()
        self.preq, self.pstatus = byref(self.req), byref(self.status)
        self.call = _lib.untyped().tent_transfer_sync
        self.results: Dict[Tuple[int, ...], RequestResult] = {}

    def result(self) -> RequestResult:
        key = _STATUS_LAYOUT.unpack_from(self.status)
        r = self.results.get(key)
        if r is None:
            if len(self.results) >= self._MAX_RESULTS:
                self.results.clear()
            r = self.results[key] = result_of(self.status)
        return r


# tent_request and tent_request_status as struct formats (native byte order,
# explicit padding: the layouts of tent.h, checked against ctypes below).
_REQUEST_LAYOUT = struct.Struct("=IIQQQQ")
_STATUS_LAYOUT = struct.Struct("=iIQIHH")
assert _REQUEST_LAYOUT.size == sizeof(_lib.Request) and _STATUS_LAYOUT.size == sizeof(_lib.RequestStatus)


def _checked_request(i: int, r: Any) -> _lib.Request:
    """One (op, local, segment, remote_addr, length) tuple as a Request,
    each field checked: ctypes would store 2**64 + x as x."""
    try:
        op, local, seg, remote, length = r
    except (TypeError, ValueError):
        raise TypeError(f"request {i} is not (op, local_addr, segment, remote_addr, length): {r!r}") from None
    what = f"request {i}"
    code = opcode(op)
    length = _check.u64(length, f"{what}: length")
    if length == 0:
        raise InvalidArgument(f"{what}: length must be positive")
    if isinstance(local, Region):
        if local.closed:
            raise InvalidHandle(f"{what}: the local region is closed")
        if length > local.size:
            raise InvalidArgument(f"{what}: length {length} is larger than the local region ({local.size} bytes)")
        if code == READ and local.readonly:
            raise InvalidArgument(f"{what}: the local region is read-only memory: it cannot be the destination of a read")
        laddr = local.addr
    else:
        laddr = _check.u64(local, f"{what}: local_addr")
    _check.span(laddr, length, f"{what}: local range")
    raddr = _check.u64(remote, f"{what}: remote_addr")
    _check.span(raddr, length, f"{what}: remote range")
    return _lib.Request(code, 0, laddr, segment_handle(seg), raddr, length)


@functools.lru_cache(maxsize=64)
def _request_arrays(n: int) -> Any:
    """The ctypes array type of n requests (a new type per call would cost more than the call)."""
    return _lib.Request * n


class _RequestViews(Dict[int, Tuple[Any, Any, int, Any]]):
    """The request arrays an engine transferred, as the transfer call takes
    them: id(array) -> (weak reference to the array, its ctypes view (None
    for a ctypes array: the array itself), n, n as the call's size_t).

    Building a view (through the buffer protocol or ``.ctypes``) costs more
    than the whole C call of a one-request transfer, and programs transfer
    the same prebuilt arrays again and again. A view stays right while its
    array lives: a numpy array's memory never moves, except by an in-place
    ``ndarray.resize``, which numpy refuses for an array that has a weak
    reference (a ctypes array is passed itself, wherever its memory is). An
    entry goes with its array. Dict operations are atomic, so threads share
    it without a lock."""

    _MAX = 256  # arrays remembered per engine; past it, start over

    def add(self, array: Any, view: Any, n: int) -> None:
        if len(self) >= self._MAX:
            self.clear()  # the dropped weak references never call back
        key = id(array)

        def forget(_: Any) -> None:
            self.pop(key, None)

        self[key] = (weakref.ref(array, forget), view, n, _ONE if n == 1 else c_size_t(n))


def _request_array(requests: Any, views: _RequestViews) -> Tuple[Any, int, Any]:
    """(ctypes array of Request, n, keepalive) for tent_transfer, without a
    Python loop for numpy and ctypes arrays; those are added to views."""
    ndarray = _check.numpy_type("ndarray")
    if ndarray is not None and type(requests) is ndarray and requests.dtype is _dtypes.get("request"):
        # The common case (make_requests' arrays), with the checks of the
        # general numpy path below in their cheapest form, remembered.
        n = requests.shape[0] if requests.ndim == 1 else 0
        if n and requests.flags.c_contiguous:
            arr = _request_arrays(n).from_address(requests.ctypes.data)
            views.add(requests, arr, n)
            return arr, n, requests
    if isinstance(requests, ctypes.Array) and requests._type_ is _lib.Request:
        n = len(requests)
        if n == 0:
            raise InvalidArgument("no requests")
        if type(requests) is _request_arrays(n):  # not a subclass, whose length may vary
            views.add(requests, None, n)
        return requests, n, requests
    if ndarray is not None and isinstance(requests, ndarray):
        dt = requests.dtype
        want = request_dtype()
        if dt is not want and dt != want:
            raise TypeError(f"a request array must have dtype tent.request_dtype, not {requests.dtype}")
        if requests.ndim != 1 or not requests.flags.c_contiguous:
            raise InvalidArgument("a request array must be one-dimensional and C-contiguous")
        n = requests.shape[0]
        if n == 0:
            raise InvalidArgument("no requests")
        if requests.flags.writeable:
            # Through the buffer protocol (cheaper than .ctypes.data, and the
            # export pins the array's memory: it cannot be resized under C).
            return _request_arrays(n).from_buffer(requests), n, requests
        return _request_arrays(n).from_address(requests.ctypes.data), n, requests
    if isinstance(requests, (list, tuple)):
        n = len(requests)
        if n <= _lib.MAX_BATCH and type(requests) not in (list, tuple):
            # A subclass's __len__ may disagree with what it iterates: the
            # items are counted as taken (at most one past the bound).
            requests = list(itertools.islice(iter(requests), _lib.MAX_BATCH + 1))
            n = len(requests)
        if n == 0:
            raise InvalidArgument("no requests")
        if n > _lib.MAX_BATCH:  # before allocating for them
            raise InvalidArgument(f"{n} requests: at most {_lib.MAX_BATCH} in one transfer")
        arr = (_lib.Request * n)()
        for i, r in enumerate(requests):
            if isinstance(r, _lib.Request):
                arr[i] = r
                continue
            arr[i] = _checked_request(i, r)
        return arr, n, arr
    raise TypeError(
        f"requests must be a numpy array of tent.request_dtype, a ctypes array of tent.Request, "
        f"or a list of (op, local_addr, segment, remote_addr, length), not {type(requests).__name__}"
    )


# ---- children ---------------------------------------------------------------


class _Child(_Managed):
    _engine: Engine
    # True where the library invalidates the handle even when releasing
    # it reports an error; False where an error leaves it valid (a BUSY
    # region stays registered).
    _always_released = False

    def __init__(self, engine: Engine, handle: int) -> None:
        super().__init__()
        self._engine = engine
        self._handle = handle

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def closed(self) -> bool:
        """True once closed, or once its engine was closed."""
        return self._handle is None or self._engine._handle is None

    def _release(self) -> None:
        """Releases the handle in the library, unless the engine (which
        released every child) is gone."""
        eh = self._engine._handle
        if eh is not None:
            st = self._free(eh, self._handle)
            if st < 0 and not (st == _lib.TENT_ERR_INVALID_HANDLE and self._engine._handle is None):
                if self._always_released and st != _lib.TENT_ERR_FORKED:
                    # the handle is gone even though the call reports an
                    # error (tent.h: batch destroy, segment close)
                    self._handle = None
                    self._drop()
                check(st)
        self._handle = None
        self._drop()

    def _free(self, engine_handle: int, handle: Optional[int]) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _drop(self) -> None:
        """Lets go of what the handle kept alive."""


class RegionInfo(NamedTuple):
    addr: int
    size: int
    location: str  # "cpu", "cpu:N", "cuda:N"
    remote_read: bool
    remote_write: bool


class Region(_Child):
    """Registered memory. Keeps the registered object alive until it is
    unregistered (``close()``, the end of a ``with`` block, or the engine's
    close). ``addr`` and ``size`` describe the memory."""

    _kind = "region"

    def __init__(self, engine: Engine, handle: int, buf: Buffer) -> None:
        super().__init__(engine, handle)
        # Re-entrant: letting go of the keepalive under the lock may run the
        # producer's code (a DLPack deleter), which may close this region
        # again; it then finds the handle gone instead of waiting for itself.
        self._lock: Any = threading.RLock()
        self.addr: int = buf.ptr
        self.size: int = buf.nbytes
        self.readonly: bool = buf.readonly
        self._keepalive: Any = buf.keepalive

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"{self.size} bytes at {self.addr:#x}"
        return f"<tent.{type(self).__name__} {state}>"

    def __len__(self) -> int:
        return self.size

    def info(self) -> RegionInfo:
        """tent_region_get_info."""
        h = self.handle
        ri = _lib.RegionInfo(size=sizeof(_lib.RegionInfo))
        check(_lib.lib().tent_region_get_info(self._engine._h(), h, byref(ri)))
        return RegionInfo(
            ri.addr,
            ri.len,
            ri.location.decode(),
            bool(ri.flags & _lib.TENT_REMOTE_READ),
            bool(ri.flags & _lib.TENT_REMOTE_WRITE),
        )

    @property
    def location(self) -> str:
        return self.info().location

    def _free(self, engine_handle: int, handle: Optional[int]) -> int:
        return _lib.lib().tent_unregister(engine_handle, handle)

    def _drop(self) -> None:
        keep, self._keepalive = self._keepalive, None
        release(keep)

    def _finalize(self) -> None:
        with self._lock:
            if self._handle is None:
                return
            try:
                self._release()
            except TentError:
                # Still in use by transfers (BUSY): never free memory under
                # them. The engine keeps handle and memory until it closes.
                self._engine._park("region", self._handle, self._keepalive)  # type: ignore[arg-type]
                self._handle = None
                self._keepalive = None


class _Views:
    """The ctypes array behind an allocation's views; counts live views
    (each memoryview or numpy array made from it holds a reference)."""

    __slots__ = ("array", "_base")

    def __init__(self, addr: int, size: int, owner: "Engine") -> None:
        self.array = (ctypes.c_char * size).from_address(addr)
        # Views reference the array, and the array its engine: an engine
        # with live views is never finalized (which would free the memory).
        self.array._tent_engine = owner  # type: ignore[attr-defined]
        self._base = sys.getrefcount(self.array)

    def exported(self) -> bool:
        return sys.getrefcount(self.array) > self._base


class AllocatedRegion(Region):
    """Memory allocated and registered by ``Engine.alloc``; ``close()``
    unregisters and frees it. Host memory is accessible in place through
    ``view()`` (a writable memoryview) and ``numpy()``; closing while such
    views are alive raises BufferError (like ``mmap.close``)."""

    def __init__(self, engine: Engine, handle: int, addr: int, size: int, location: str) -> None:
        super().__init__(engine, handle, Buffer(addr, size, False, location, None))
        self._views: Optional[_Views] = None
        if not location.startswith("cuda"):
            self._views = _Views(addr, size, engine)

    def view(self) -> memoryview:
        """A writable memoryview of the allocation (host memory only)."""
        return self._view()

    def _view(self) -> memoryview:
        # The memory is unmapped once the allocation or its engine is
        # closed: a view made after that would crash the process when used.
        # Both closes check for live views under their lock, so the view is
        # made under both locks (engine, then allocation: no close takes
        # them in the other order), never in between a check and the free.
        _refuse_if_forked(self)
        engine = self._engine
        with engine._lock, self._lock:
            if self._handle is None:
                raise InvalidHandle("this allocation is closed")
            if engine._handle is None:
                raise InvalidHandle("the allocation's engine is closed")
            if self._views is None:
                raise InvalidArgument("GPU memory has no host view")
            return memoryview(self._views.array).cast("B")

    def numpy(self, dtype: Any = "u1", shape: Any = None) -> Any:
        """A numpy array over the allocation (zero-copy, host memory only)."""
        np = _check.numpy("AllocatedRegion.numpy")

        arr = np.frombuffer(self._view(), dtype=dtype)
        return arr if shape is None else arr.reshape(shape)

    def __buffer__(self, flags: int) -> memoryview:  # Python 3.12+ buffer protocol
        return self.view()

    def close(self) -> None:
        _refuse_if_forked(self)
        with self._lock:
            if self._handle is None:
                return
            if self._views is not None and self._views.exported() and self._engine._handle is not None:
                raise BufferError("cannot free the allocation: views of it (memoryview/numpy) are still alive")
            self._release()

    def _free(self, engine_handle: int, handle: Optional[int]) -> int:
        return _lib.lib().tent_free(engine_handle, handle)

    def _drop(self) -> None:
        self._keepalive = None

    def _finalize(self) -> None:
        with self._lock:
            if self._handle is None:
                return
            if self._views is None or not self._views.exported():
                try:
                    self._release()
                    return
                except TentError:
                    pass
            self._engine._park("alloc", self._handle, self._views)  # type: ignore[arg-type]
            self._handle = None


# The timeouts and transports whose options Engine._options_arg remembers:
# equal values of these types make equal options (an int and a float that
# compare equal are the same number of milliseconds).
_PLAIN_TIMEOUTS = frozenset((int, float, type(None)))
_PLAIN_TRANSPORTS = frozenset((str, type(None)))

# Exactly these types take _local's fast path (a subclass takes the checked one).
_REGION_TYPES = (Region, AllocatedRegion)


class Segment(_Child):
    """A peer's segment (``Engine.open_segment``); pass it to transfers."""

    _kind = "segment"
    _always_released = True

    def __init__(self, engine: Engine, handle: int, name: str) -> None:
        super().__init__(engine, handle)
        self.name = name

    def __repr__(self) -> str:
        return f"<tent.Segment {self.name!r}{' closed' if self._handle is None else ''}>"

    def _free(self, engine_handle: int, handle: Optional[int]) -> int:
        return _lib.lib().tent_segment_close(engine_handle, handle)


class Batch(_Child):
    """Submitted requests (``Engine.transfer``). ``wait()`` blocks until all
    finished; ``status()`` gives each request's result; ``close()`` (or the
    end of a ``with`` block) releases the batch, canceling what still runs,
    after which the library no longer touches the requests' memory."""

    _kind = "batch"
    _always_released = True
    _WAIT_SLICE_MS = 200  # waits return to Python this often (Ctrl-C works)
    _WAIT_SLICE = ctypes.c_int64(_WAIT_SLICE_MS)  # the same, for the untyped call; never modified
    _statuses: Any = None  # the status array, made by the first status call

    def __init__(self, engine: Engine, handle: int, n: int, succeeded: bool, handle_arg: c_void_p) -> None:
        # _Managed and _Child's fields, set here: one batch per transfer call.
        self._lock = threading.Lock()
        self._engine = engine
        self._handle = handle
        self._handle_arg = handle_arg  # c_void_p(handle), never modified
        self._n = n
        # Every request had succeeded when the batch was submitted (the
        # library said so): wait() then needs no call.
        self._succeeded = succeeded

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"<tent.Batch {self._n} requests{' closed' if self._handle is None else ''}>"

    def _free(self, engine_handle: int, handle: Optional[int]) -> int:
        return _lib.lib().tent_batch_destroy(handle)

    def close(self, *_exc: Any) -> None:
        """Releases the batch (canceling what still runs); a no-op when
        already closed."""
        if _lib.forked and self._handle is not None:
            raise fork_error()  # _refuse_if_forked, written out
        with self._lock:
            h = self._handle
            if h is None:
                return
            # _Child._release, written out for the one-request path.
            engine = self._engine
            if engine._handle is not None:
                st = engine._fast.tent_batch_destroy(self._handle_arg)
                if st < 0 and not (st == _lib.TENT_ERR_INVALID_HANDLE and self._engine._handle is None):
                    if st != _lib.TENT_ERR_FORKED:
                        self._handle = None  # gone even though the call reports an error (tent.h)
                    check(st)
            self._handle = None

    # The end of a with block is close() itself: no frame in between.
    __exit__ = close

    def _poll(self) -> Tuple[int, str, int]:
        """tent_batch_status of no entries: (status, the message if it is
        an error, completed). Raises if the call itself failed (tent.h: then
        completed_out is not written)."""
        dll = _lib.lib()
        done = c_size_t(_UNSET)
        st = dll.tent_batch_status(self.handle, None, 0, byref(done))
        if st < 0 and done.value == _UNSET:
            check(st)
        return st, (dll.tent_last_error().decode("utf-8", "replace") if st < 0 else ""), done.value

    @property
    def done(self) -> bool:
        """True once every request finished (successfully or not)."""
        return self._poll()[0] != _PENDING

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits until every request finished. Returns None if all
        succeeded; raises the first failed request's error (see
        ``status()`` for each one), or tent.Timeout if requests are still
        running after timeout seconds (None: until the batch's own
        deadline). The batch stays valid either way."""
        engine = self._engine
        if timeout is None and self._handle is not None and engine._handle is not None:
            if self._succeeded:
                return  # finished when submitted: nothing to wait for
            st = engine._fast.tent_batch_wait(self._handle_arg, self._WAIT_SLICE)  # the common case: one slice
            if st == _OK:
                return
        h = self._handle
        if h is None:
            h = self.handle  # raises
        dll = engine._calls
        ms = _check.millis(timeout, "timeout", zero_is_default=False, inf_ok=True)
        while True:
            step = self._WAIT_SLICE_MS if ms < 0 else min(ms, self._WAIT_SLICE_MS)
            st = dll.tent_batch_wait(h, step)
            if st == _OK:
                return
            if st != _lib.TENT_ERR_TIMEOUT:
                check(st)
            msg = dll.tent_last_error().decode("utf-8", "replace")
            polled, pmsg, _ = self._poll()
            if polled == _OK:
                return
            if polled != _PENDING:  # a request failed (perhaps with TIMEOUT)
                raise error_for(polled, pmsg)
            if ms >= 0:
                ms -= step
                if ms <= 0:
                    raise Timeout(msg or f"the batch is still running after {timeout} s", _lib.TENT_ERR_TIMEOUT)

    def _status_array(self) -> Tuple[Any, int]:
        if self._statuses is None:
            self._statuses = (_lib.RequestStatus * self._n)()
        done = c_size_t(_UNSET)
        st = _lib.lib().tent_batch_status(self.handle, self._statuses, self._n, byref(done))
        if st < 0 and done.value == _UNSET:
            check(st)  # the call failed; other codes are the requests' outcome
        return self._statuses, done.value

    def status(self) -> List[RequestResult]:
        """Each request's result, in submission order (``code``,
        ``transport``, ``bytes``, ``retried``, ``staged``; ``.ok``, ``.pending``,
        ``.error``)."""
        arr, _ = self._status_array()
        return [result_of(s) for s in arr]

    def status_array(self) -> Any:
        """The results as a numpy array of ``tent.status_dtype`` (a copy)."""
        np = _check.numpy("Batch.status_array")

        from ._requests import status_dtype

        arr, _ = self._status_array()
        return np.frombuffer(arr, dtype=status_dtype()).copy()

    @property
    def completed(self) -> int:
        """How many requests finished."""
        return self._poll()[2]


# ---- module functions -------------------------------------------------------


def topology() -> Dict[str, Any]:
    """The GPU topology (NVML) as a dict; no GPU is ``"gpus": []``."""
    dll = _lib.lib()
    return json.loads(_read_string(lambda b, c, n: dll.tent_topology_json(b, c, n), 1024))


def version() -> str:
    """The loaded library's version, "major.minor.patch"."""
    return _lib.lib().tent_version_string().decode()


def version_info() -> Tuple[int, int, int]:
    """The loaded library's version as (major, minor, patch)."""
    v = _lib.lib().tent_version()
    return (v >> 16, (v >> 8) & 0xFF, v & 0xFF)


def _close_all_at_exit() -> None:
    if _lib.forked or not _lib.loaded():
        return
    for engine in list(_live_engines):
        try:
            engine.close()
        except Exception:  # noqa: BLE001 - best effort at exit (views alive: skip)
            pass


atexit.register(_close_all_at_exit)
