"""Mooncake's ``TransferEngine`` Python API on tent.

Same call names, arguments and return conventions as
``mooncake.engine.TransferEngine`` (every call returns an int: 0 on
success, a negative number on failure; batch ids are positive ints, 0 on
failure), so a client written against Mooncake runs unchanged::

    from tent.compat.mooncake import TransferEngine   # or, with the tent-compat
                                                      # wheel: from mooncake.engine import ...
    engine = TransferEngine()
    engine.initialize("10.0.0.1", "P2PHANDSHAKE", "rdma", "")
    session = f"10.0.0.1:{engine.get_rpc_port()}"
    engine.register_memory(addr, length)
    engine.transfer_sync_write(peer_session, addr, peer_addr, length)

Underneath is one ``tent.Engine``: tent's registration index checks every
remote address against what the peer registered, tent's deadline bounds
every call (``TENT_COMPAT_TIMEOUT`` / ``MC_TRANSFER_TIMEOUT``), and a
failure's tent message is logged (logger ``tent.compat.mooncake``) and kept
in ``last_error``. Metadata: ``P2PHANDSHAKE`` (tent's peer-to-peer
metadata; the segment name is ``host:port``), ``etcd://host:port`` or a
bare ``host:port`` (tent's etcd directory; the segment name is
``local_hostname``), ``http://host:port/metadata`` (Mooncake's HTTP
metadata protocol, see ``tent.compat.http_metadata``).

See docs/COMPAT.md for each call's status next to Mooncake's.
"""

from __future__ import annotations

import collections
import ctypes
import enum
import itertools
import json
import logging
import os
import threading
import weakref
from typing import Any, Deque, Dict, List, Optional, Tuple

import tent

from . import _common, _pybind
from .http_metadata import HTTPMetadataClient

logger = logging.getLogger("tent.compat.mooncake")

P2PHANDSHAKE = "P2PHANDSHAKE"

# Mooncake's build flags: what this API serves. CUDA-stream transfers
# (transfer_*_on_cuda) are not provided; tent moves GPU memory itself when
# it is registered (cuda transport, or staged through host memory).
SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False

# Mooncake's transfer_check_status answers
_CHECK_DONE, _CHECK_PENDING, _CHECK_FAILED, _CHECK_TIMEOUT = 1, 0, -1, -2
_FAIL = -1
# Mooncake's error.h codes that its registration calls return and clients
# compare with: a range overlapping one already registered (a double
# register included), and an address that was never registered.
ERR_INVALID_ARGUMENT = -1
ERR_ADDRESS_NOT_REGISTERED = -3
ERR_ADDRESS_OVERLAPPED = -7


def _registration_code(exc: BaseException) -> int:
    """Mooncake's code for a failed (un)registration."""
    if isinstance(exc, (tent.Overlap, tent.AlreadyRegistered)):
        return ERR_ADDRESS_OVERLAPPED
    if isinstance(exc, tent.NotRegistered):
        return ERR_ADDRESS_NOT_REGISTERED
    return _FAIL

# How long get_first_buffer_address waits for a peer's answer without a
# configured deadline (tent's default request deadline).
_DEFAULT_DEADLINE_S = 30.0
# How often the notification pump drains tent's queue.
_PUMP_SLICE_S = 0.02


# What get_engine() returns, under the name Mooncake's module gives its
# engine class (there a C++ TransferEngine, here tent's).
InnerTransferEngine = tent.Engine


class TransferOpcode(enum.IntEnum):
    """Mooncake's opcodes (``TransferEngine.TransferOpcode.Read``/``Write``)."""

    Read = 0
    Write = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification: the name the sender gave it and its message (str).
    Built as the bindings build it: ``TransferNotify()`` or
    ``TransferNotify(name, msg)``, both strings (or bytes), positionally or
    by keyword; anything else is their TypeError."""

    __slots__ = ("_name", "_msg")

    _SUPPORTED = ("mooncake.engine.TransferNotify()", "mooncake.engine.TransferNotify(name: str, msg: str)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            if not args and not kwargs:
                name, msg = "", ""
            else:
                name, msg = _pybind._bind(_NOTIFY_PARAMS, args, kwargs)
            self._name, self._msg = _pybind.text(name), _pybind.text(msg)
        except _pybind.Mismatch:
            raise _pybind.incompatible("__init__", self._SUPPORTED, args, kwargs, constructor=True) from None

    def _set(self, slot: str, value: Any) -> None:
        try:
            setattr(self, slot, _pybind.text(value))
        except _pybind.Mismatch:
            raise _pybind.incompatible("", ["(self: mooncake.engine.TransferNotify, arg0: str) -> None"],
                                       (self, value), {}) from None

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: Any) -> None:
        self._set("_name", value)

    @property
    def msg(self) -> str:
        return self._msg

    @msg.setter
    def msg(self, value: Any) -> None:
        self._set("_msg", value)

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)


_NOTIFY_PARAMS = (_pybind.Param("name", "str", _pybind.text), _pybind.Param("msg", "str", _pybind.text))

# ---- the bindings' parameter types (see _pybind) ----

_OWNER = "mooncake.engine.TransferEngine"


def _int(name: Optional[str] = None) -> _pybind.Param:
    return _pybind.Param(name, "int", _pybind.uint)


def _str(name: Optional[str] = None, default: Any = _pybind._NO_DEFAULT) -> _pybind.Param:
    """A std::string parameter."""
    return _pybind.Param(name, "str", _pybind.text, default)


def _cstr(name: Optional[str] = None, default: Any = _pybind._NO_DEFAULT) -> _pybind.Param:
    """A const char * parameter (None passes, as a null pointer)."""
    return _pybind.Param(name, "str", _pybind.ctext, default)


def _ints(name: Optional[str] = None, elements_later: bool = False) -> _pybind.Param:
    """A std::vector<uintptr_t> parameter. elements_later: only the sequence
    is checked here, the body converts the elements (in one pass, into the
    request rows) and raises Mismatch for one the bindings would refuse."""
    return _pybind.Param(name, "list[int]", _pybind.sequence if elements_later else _pybind.uints)


_OPCODE = _pybind.Param("opcode", "mooncake.engine.TransferOpcode", _pybind.instance_of(TransferOpcode))
_NOTIFY = _pybind.Param("notify", "mooncake.engine.TransferNotify", _pybind.instance_of(TransferNotify, none=True),
                        None, "None")
_HINT = _str("transport_hint", "")
_TARGET = _cstr("target_hostname")
_ONE = (_TARGET, _int("buffer"), _int("peer_buffer_address"), _int("length"))
_MANY = (_TARGET, _ints("buffers", True), _ints("peer_buffer_addresses", True), _ints("lengths", True))


def _parse_metadata(metadata_server: str, metadata_type: Optional[str]) -> Tuple[str, str]:
    """(kind: "p2p" | "etcd" | "http", the address) the way Mooncake reads
    its metadata connection string."""
    conn = (metadata_server or "").strip()
    if conn == P2PHANDSHAKE or (not conn and metadata_type in (None, "", "p2p")):
        return "p2p", ""
    if "://" in conn:
        scheme, rest = conn.split("://", 1)
    else:
        scheme, rest = (metadata_type or "etcd"), conn
    scheme = scheme.lower()
    if scheme == "etcd":
        return "etcd", "etcd://" + rest
    if scheme in ("http", "https"):
        return "http", f"{scheme}://{rest}"
    raise ValueError(f"metadata {metadata_server!r}: tent serves P2PHANDSHAKE, etcd:// and http:// "
                     f"(not {scheme!r})")


def _engine_on_port(host: str, port: int, **kwargs: Any) -> Tuple[tent.Engine, int]:
    """An engine listening on host:port; with port 0, on a port picked here
    (the engine's name is not its address, so get_rpc_port needs the
    number), picked again when another socket took it before the bind."""
    if port:
        return tent.Engine(listen_addr=f"{host}:{port}", **kwargs), port
    for attempt in range(5):
        port = _common.free_port(host)
        try:
            return tent.Engine(listen_addr=f"{host}:{port}", **kwargs), port
        except tent.TentError as exc:
            if attempt == 4 or "address already in use" not in str(exc).lower():
                raise
    raise AssertionError("unreachable")


class _EmptyBatch:
    """An async batch of no requests: Mooncake submits it and reports it
    completed (a batch without tasks is COMPLETED), tent has nothing to post."""

    done = True

    def wait(self, timeout: Optional[float] = None) -> None:
        pass

    def close(self) -> None:
        pass


class TransferEngine:
    """Mooncake's TransferEngine, served by tent (see the module doc)."""

    TransferOpcode = TransferOpcode

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: Optional[tent.Engine] = None
        self._segment_name = ""
        self._rpc_port = 0
        self._http: Optional[HTTPMetadataClient] = None
        self._segments: Dict[str, tent.Segment] = {}
        self._regions: Dict[int, tent.Region] = {}          # addr -> registered memory
        self._managed: Dict[int, tent.AllocatedRegion] = {}  # addr -> allocate_managed_buffer
        self._order: List[int] = []                          # addresses in registration order
        self._batches: Dict[int, tent.Batch] = {}
        self._ids = itertools.count(1)
        self._notifies: Deque[TransferNotify] = collections.deque()
        self._answers: Dict[str, Any] = {}
        self._answered = threading.Condition(self._lock)
        self._pump: Optional[threading.Thread] = None
        self._drain_lock = threading.Lock()
        self._stop = threading.Event()
        self.last_error = ""  # tent's message for the last failed call (tent addition)

    # ---- failures ----

    def _fail(self, what: str, exc: BaseException, code: int = _FAIL) -> int:
        if isinstance(exc, _pybind.Mismatch):
            raise exc  # an argument the bindings refuse: their TypeError, not a code
        self.last_error = f"{what}: {exc}"
        logger.error("%s", self.last_error)
        return code

    def _need(self) -> tent.Engine:
        e = self._engine
        if e is None:
            raise tent.InvalidHandle("the transfer engine is not initialized (call initialize first)")
        return e

    # ---- setup ----

    @_pybind.method(_OWNER, "int", _cstr(), _cstr(), _cstr(), _cstr())
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        """Starts the engine. ``local_hostname`` is "host" or "host:port"
        (the port to listen on; none = any), ``metadata_server``
        ``P2PHANDSHAKE`` / ``etcd://h:p`` / ``h:p`` (etcd) / ``http://h:p/metadata``,
        ``protocol`` "tcp" (tcp only) or anything else ("rdma", ...: the best
        transport tent has, logged once), ``device_name`` ignored (tent picks
        devices itself). Returns 0, or -1."""
        return self._initialize(local_hostname, metadata_server, protocol, None)

    @_pybind.method(_OWNER, "int", _cstr(), _cstr(), _cstr(), _cstr(), _cstr())
    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str,
                       metadata_type: Optional[str]) -> int:
        """``initialize`` with the metadata type ("etcd", "http", "p2p") for
        a connection string without a scheme."""
        if metadata_type is None:
            raise RuntimeError("basic_string: construction from null is not valid")
        return self._initialize(local_hostname, metadata_server, protocol, metadata_type)

    def _initialize(self, local_hostname: Optional[str], metadata_server: Optional[str], protocol: Optional[str],
                    metadata_type: Optional[str]) -> int:
        if local_hostname is None or metadata_server is None:
            # Mooncake makes std::strings of both at once; pybind11 raises the throw
            raise RuntimeError("basic_string: construction from null is not valid")
        if protocol is None:
            # Mooncake's engine reads it with strcmp and crashes the process:
            # refused here instead
            raise RuntimeError("protocol is None: initialize needs a protocol (\"tcp\", \"rdma\", ...)")
        try:
            with self._lock:
                if self._engine is not None:
                    raise tent.InvalidArgument("the transfer engine is already initialized")
                self._start(local_hostname, metadata_server, protocol, metadata_type)
        except Exception as exc:  # noqa: BLE001 - Mooncake's contract is a code
            return self._fail("initialize", exc)
        try:  # numpy imported here, not concurrently by the pump's first calls
            import numpy  # noqa: F401
        except ImportError:
            pass
        self._pump = threading.Thread(target=TransferEngine._pump_loop, args=(weakref.ref(self), self._stop),
                                      name="tent-compat-mooncake-notify", daemon=True)
        self._pump.start()
        return 0

    def _start(self, local_hostname: str, metadata_server: str, protocol: str, metadata_type: Optional[str]) -> None:
        kind, addr = _parse_metadata(metadata_server, metadata_type)
        host, port = _common.split_host_port(local_hostname or "127.0.0.1")
        host = host or "127.0.0.1"
        if os.environ.get("MC_FORCE_TCP", "").strip().lower() in ("1", "true", "yes", "on"):
            protocol = "tcp"  # Mooncake's switch to its TCP transport, whatever protocol says
        transports, note = _common.transports_for(protocol)
        if note:
            logger.warning("protocol %s", note)
        common: Dict[str, Any] = dict(transports=transports, secret=_common.secret(), timeout=_common.timeout())
        if kind == "etcd":
            engine, port = _engine_on_port(host, port, name=local_hostname, metadata=addr, **common)
            self._segment_name = engine.name
        else:
            engine = tent.Engine(listen_addr=f"{host}:{port}", **common)
            port = int(_common.split_host_port(engine.name)[1])
            self._segment_name = engine.name
            if kind == "http":
                try:
                    client = HTTPMetadataClient(addr)
                    name = local_hostname if ":" in local_hostname else f"{host}:{port}"
                    client.publish_segment(name, engine.name)
                except BaseException:
                    engine.close()
                    raise
                self._http, self._segment_name = client, name
        self._engine, self._rpc_port = engine, port
        logger.info("tent engine %s (metadata %s, transports %s)", self._segment_name, kind,
                    ",".join(engine.transports))

    def get_rpc_port(self) -> int:
        """The port peers reach this engine on (P2PHANDSHAKE: the segment
        name is ``host:<this port>``)."""
        return self._rpc_port

    def get_engine(self) -> Optional[tent.Engine]:
        """The tent.Engine underneath (Mooncake: its C++ engine object)."""
        return self._engine

    def get_engine_ptr(self) -> int:
        """The tent_engine handle (Mooncake: its C++ engine's address)."""
        e = self._engine
        return 0 if e is None or e.closed else e.handle

    # ---- memory ----

    @_pybind.method(_OWNER, "int", _int("buffer_addr"), _int("capacity"), _str("location", "*"))
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Registers [buffer_addr, +capacity). ``location`` "*" = detect,
        or "cpu:N" / "cuda:N". Returns 0, ERR_ADDRESS_OVERLAPPED (-7: already
        registered, or overlapping), or -1 (a bad range)."""
        try:
            e = self._need()
            region = e.register((buffer_addr, capacity), location=_location(location))
            with self._lock:
                self._regions[region.addr] = region
                self._order.append(region.addr)
            return 0
        except Exception as exc:  # noqa: BLE001
            return self._fail("register_memory", exc, _registration_code(exc))

    @_pybind.method(_OWNER, "int", _int())
    def unregister_memory(self, buffer_addr: int) -> int:
        """Unregisters the memory registered at buffer_addr (waiting for
        transfers still using it, up to tent's unregister timeout). Returns
        0, or ERR_ADDRESS_NOT_REGISTERED (-3) for an address never registered."""
        try:
            with self._lock:
                region = self._regions.pop(buffer_addr, None)
            if region is None:
                raise tent.NotRegistered(f"no memory registered at {buffer_addr:#x}")
            try:
                region.close()
            except BaseException:
                with self._lock:
                    self._regions[region.addr] = region
                raise
            with self._lock:
                self._order.remove(region.addr)
            return 0
        except Exception as exc:  # noqa: BLE001
            return self._fail("unregister_memory", exc, _registration_code(exc))

    @_pybind.method(_OWNER, "int", _ints("buffer_addresses"), _ints("capacities"), _str("location", "*"))
    def batch_register_memory(self, buffer_addresses: List[int], capacities: List[int],
                              location: str = "*") -> int:
        """Registers many buffers, all or none."""
        try:
            e = self._need()
            addrs, caps = buffer_addresses, capacities
            if len(addrs) != len(caps):
                raise tent.InvalidArgument(f"{len(addrs)} addresses but {len(caps)} capacities")
            regions = e.register_batch([(a, c) for a, c in zip(addrs, caps)], location=_location(location))
            with self._lock:
                for r in regions:
                    self._regions[r.addr] = r
                    self._order.append(r.addr)
            return 0
        except Exception as exc:  # noqa: BLE001
            return self._fail("batch_register_memory", exc, _registration_code(exc))

    @_pybind.method(_OWNER, "int", _ints())
    def batch_unregister_memory(self, buffer_addresses: List[int]) -> int:
        """Unregisters many buffers, all or none."""
        try:
            e = self._need()
            addrs = buffer_addresses
            with self._lock:
                missing = [a for a in addrs if a not in self._regions]
                if missing:
                    raise tent.NotRegistered(f"no memory registered at {missing[0]:#x}")
                regions = [self._regions[a] for a in addrs]
            e.unregister_batch(regions)
            with self._lock:
                for a in addrs:
                    self._regions.pop(a, None)
                    self._order.remove(a)
            return 0
        except Exception as exc:  # noqa: BLE001
            return self._fail("batch_unregister_memory", exc, _registration_code(exc))

    @_pybind.method(_OWNER, "int", _int())
    def allocate_managed_buffer(self, length: int) -> int:
        """Allocates and registers length bytes (tent_alloc: shared memory
        same-host peers map directly). Returns its address, 0 on failure."""
        try:
            region = self._need().alloc(length)
            with self._lock:
                self._managed[region.addr] = region
                self._order.append(region.addr)
            return region.addr
        except Exception as exc:  # noqa: BLE001
            return self._fail("allocate_managed_buffer", exc, 0)

    @_pybind.method(_OWNER, "int", _int(), _int())
    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Frees a buffer from allocate_managed_buffer."""
        try:
            with self._lock:
                region = self._managed.pop(buffer_addr, None)
            if region is None:
                raise tent.NotRegistered(f"{buffer_addr:#x} is not a managed buffer of this engine")
            region.close()
            with self._lock:
                self._order.remove(region.addr)
            return 0
        except Exception as exc:  # noqa: BLE001
            return self._fail("free_managed_buffer", exc)

    @_pybind.method(_OWNER, "int", _int(), _pybind.Param(None, "str", _pybind.cbytes), _int())
    def write_bytes_to_buffer(self, dest_address: int, src: Optional[bytes], length: int) -> int:
        """Copies length bytes of src (bytes, bytearray, or str as UTF-8) to
        dest_address (local memory)."""
        try:
            if src is None:
                raise ValueError("no source bytes (None)")
            data, n = src, length
            if n > len(data):
                raise ValueError(f"length {n} exceeds the {len(data)} bytes given")
            addr = self._host_range(dest_address, n)
        except Exception as exc:  # noqa: BLE001
            return self._fail("write_bytes_to_buffer", exc)
        ctypes.memmove(addr, data, n)
        return 0

    @_pybind.method(_OWNER, "bytes", _int(), _int())
    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """length bytes at source_address (local memory). Mooncake copies
        from any address; tent reads only inside host memory this engine
        registered or allocated, and raises ValueError for anything else
        (where a raw copy would crash the process)."""
        return ctypes.string_at(self._host_range(source_address, length), length)

    def _host_range(self, addr: int, n: int) -> int:
        """addr, checked to start n bytes inside host memory this engine
        registered or allocated (ValueError otherwise)."""
        with self._lock:
            regions = list(self._regions.values()) + list(self._managed.values())
        for r in regions:
            if r.addr <= addr and addr + n <= r.addr + r.size:
                if not r.info().location.startswith("cpu"):
                    raise ValueError(f"{addr:#x} is device memory: copy it with a transfer")
                return addr
        raise ValueError(f"[{addr:#x}, +{n}) is not inside host memory this engine registered or allocated")

    @_pybind.method(_OWNER, "int", _str())
    def get_first_buffer_address(self, segment_name: str) -> int:
        """The address of the first buffer registered in segment_name (this
        engine's own, or a peer's: asked of the peer through tent's
        notifications). 0 when it has none or cannot be asked."""
        try:
            if segment_name in (self._segment_name, self._engine.name if self._engine else None):
                with self._lock:
                    return self._order[0] if self._order else 0
            return self._ask_first_buffer(segment_name)
        except Exception as exc:  # noqa: BLE001
            return self._fail("get_first_buffer_address", exc, 0)

    # ---- peers ----

    def _segment(self, target: str) -> tent.Segment:
        seg = self._segments.get(target)
        if seg is not None and not seg.closed:
            return seg
        e = self._need()
        name = target
        if self._http is not None:
            resolved = self._http.resolve_segment(target)
            if resolved is None:
                raise tent.NotFound(f"segment {target!r} is not published at {self._http.url}")
            name = resolved
        seg = e.open_segment(name)
        with self._lock:
            old = self._segments.get(target)
            if old is not None and not old.closed:
                seg.close()
                return old
            self._segments[target] = seg
        return seg

    @_pybind.method(_OWNER, "int", _str("peer_server_name"))
    def send_probe(self, peer_server_name: str) -> int:
        """0 if the peer answers tent's handshake now, -1 if not."""
        try:
            e = self._need()
            name = peer_server_name
            if self._http is not None:
                name = self._http.resolve_segment(peer_server_name) or peer_server_name
            e.open_segment(name).close()
            return 0
        except Exception as exc:  # noqa: BLE001
            return self._fail("send_probe", exc)

    @_pybind.method(_OWNER, "int", _str("segment_name"))
    def warmup_efa_segment(self, segment_name: str) -> int:
        """Opens the peer's segment ahead of the first transfer."""
        try:
            self._segment(segment_name)
            return 0
        except Exception as exc:  # noqa: BLE001
            return self._fail("warmup_efa_segment", exc)

    # ---- transfers ----

    def _sync_one(self, op: str, target: str, buffer: int, peer: int, length: int, hint: str,
                  notify: Optional[TransferNotify] = None) -> int:
        if target is None:
            raise _null_target()
        try:
            e = self._need()
            seg = self._segment(target)
            transport = _hint(hint)
            if notify is None:
                if op == "write":
                    e.write((buffer, length), seg, peer, transport=transport)
                else:
                    e.read((buffer, length), seg, peer, transport=transport)
                return 0
            cols, addr = _common.column_words([buffer], [peer], [length])
            _common.transfer_columns_sync(e, op, seg, cols, addr,
                                          _common.transfer_options(e, self._wrap(notify), transport))
            return 0
        except Exception as exc:  # noqa: BLE001
            return self._fail(f"transfer_sync_{op}({target})", exc)

    def _sync_many(self, op: str, target: str, buffers: Any, peers: Any, lengths: Any, hint: str,
                   notify: Optional[TransferNotify] = None) -> int:
        if target is None:
            raise _null_target(buffers, peers, lengths)
        try:
            # first, as the bindings convert before the call
            cols, addr = _common.column_words(buffers, peers, lengths)
            e = self._need()
            seg = self._segment(target)
            if cols.shape[1] == 0:
                return 0
            wrapped = self._wrap(notify) if notify is not None else None
            _common.transfer_columns_sync(e, op, seg, cols, addr, _common.transfer_options(e, wrapped, _hint(hint)))
            return 0
        except Exception as exc:  # noqa: BLE001
            return self._fail(f"batch_transfer_sync_{op}({target})", exc)

    def _submit(self, op: str, target: str, buffers: Any, peers: Any, lengths: Any, hint: str) -> int:
        if target is None:
            raise _null_target(buffers, peers, lengths)
        try:
            cols, addr = _common.column_words(buffers, peers, lengths)
            e = self._need()
            seg = self._segment(target)
            batch: Any = _EmptyBatch() if cols.shape[1] == 0 else _common.transfer_columns(
                e, op, seg, cols, addr, _common.transfer_options(e, None, _hint(hint)))
            with self._lock:
                bid = next(self._ids)
                self._batches[bid] = batch
            return bid
        except Exception as exc:  # noqa: BLE001
            return self._fail(f"batch_transfer_async_{op}({target})", exc, 0)

    @_pybind.method(_OWNER, "int", *_ONE, _HINT)
    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                            transport_hint: str = "") -> int:
        """Writes length bytes at buffer (registered here) to
        peer_buffer_address (registered by the peer) and waits."""
        return self._sync_one("write", target_hostname, buffer, peer_buffer_address, length, transport_hint)

    @_pybind.method(_OWNER, "int", *_ONE, _HINT)
    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                           transport_hint: str = "") -> int:
        """Reads length bytes at peer_buffer_address into buffer and waits."""
        return self._sync_one("read", target_hostname, buffer, peer_buffer_address, length, transport_hint)

    @_pybind.method(_OWNER, "int", *_ONE, _OPCODE, _NOTIFY, _HINT)
    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                      opcode: int, notify: Optional[TransferNotify] = None,
                      transport_hint: str = "") -> int:
        """One transfer of either direction, with an optional notify the
        peer receives (get_notifies) after the data."""
        return self._sync_one(_op(opcode), target_hostname, buffer, peer_buffer_address, length,
                              transport_hint, notify)

    @_pybind.method(_OWNER, "int", *_MANY, _HINT)
    def batch_transfer_sync_write(self, target_hostname: str, buffers: List[int],
                                  peer_buffer_addresses: List[int], lengths: List[int],
                                  transport_hint: str = "") -> int:
        """Writes every (buffer, peer address, length) triple as one batch and waits."""
        return self._sync_many("write", target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint)

    @_pybind.method(_OWNER, "int", *_MANY, _HINT)
    def batch_transfer_sync_read(self, target_hostname: str, buffers: List[int],
                                 peer_buffer_addresses: List[int], lengths: List[int],
                                 transport_hint: str = "") -> int:
        """Reads every triple as one batch and waits."""
        return self._sync_many("read", target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint)

    @_pybind.method(_OWNER, "int", *_MANY, _OPCODE, _NOTIFY, _HINT)
    def batch_transfer_sync(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int],
                            lengths: List[int], opcode: int, notify: Optional[TransferNotify] = None,
                            transport_hint: str = "") -> int:
        return self._sync_many(_op(opcode), target_hostname, buffers, peer_buffer_addresses, lengths,
                               transport_hint, notify)

    @_pybind.method(_OWNER, "int", *_MANY, _HINT)
    def batch_transfer_async_write(self, target_hostname: str, buffers: List[int],
                                   peer_buffer_addresses: List[int], lengths: List[int],
                                   transport_hint: str = "") -> int:
        """Submits the writes and returns a batch id (0 on failure) for
        get_batch_transfer_status."""
        return self._submit("write", target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint)

    @_pybind.method(_OWNER, "int", *_MANY, _HINT)
    def batch_transfer_async_read(self, target_hostname: str, buffers: List[int],
                                  peer_buffer_addresses: List[int], lengths: List[int],
                                  transport_hint: str = "") -> int:
        return self._submit("read", target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint)

    @_pybind.method(_OWNER, "int", *_MANY, _OPCODE, _HINT)
    def batch_transfer_async(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int],
                             lengths: List[int], opcode: int, transport_hint: str = "") -> int:
        return self._submit(_op(opcode), target_hostname, buffers, peer_buffer_addresses, lengths,
                            transport_hint)

    @_pybind.method(_OWNER, "int", *_ONE, _HINT)
    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                              transport_hint: str = "") -> int:
        """Submits one write; poll it with transfer_check_status."""
        return self._submit("write", target_hostname, [buffer], [peer_buffer_address], [length], transport_hint)

    @_pybind.method(_OWNER, "int", _ints())
    def get_batch_transfer_status(self, batch_ids: List[int]) -> int:
        """Waits for every batch (each bounded by tent's deadline) and
        releases them: 0 if all succeeded, -1 if any failed (all released)."""
        with self._lock:
            batches = [(b, self._batches.pop(b, None)) for b in batch_ids]
        rc = 0
        for bid, batch in batches:
            if batch is None:
                rc = self._fail("get_batch_transfer_status", tent.InvalidHandle(f"unknown batch id {bid}"))
                continue
            try:
                batch.wait()
            except Exception as exc:  # noqa: BLE001
                rc = self._fail(f"batch {bid}", exc)
            finally:
                _close_quietly(batch)
        return rc

    @_pybind.method(_OWNER, "int", _int())
    def transfer_check_status(self, batch_id: int) -> int:
        """1 done (released), 0 still running, -1 failed (released), -2 timed out (released)."""
        with self._lock:
            batch = self._batches.get(batch_id)
        if batch is None:
            return self._fail("transfer_check_status", tent.InvalidHandle(f"unknown batch id {batch_id}"))
        try:
            if not batch.done:
                return _CHECK_PENDING
            batch.wait(0)
            code = _CHECK_DONE
        except tent.Timeout as exc:
            code = self._fail(f"batch {batch_id}", exc, _CHECK_TIMEOUT)
        except Exception as exc:  # noqa: BLE001
            code = self._fail(f"batch {batch_id}", exc, _CHECK_FAILED)
        with self._lock:
            self._batches.pop(batch_id, None)
        _close_quietly(batch)
        return code

    # ---- notifications ----

    def _wrap(self, notify: TransferNotify) -> bytes:
        if not isinstance(notify, TransferNotify):
            raise TypeError(f"notify must be a TransferNotify, not {type(notify).__name__}")
        return _common.envelope(_common.KIND_USER, notify.name, _common.as_bytes(notify.msg))

    def get_notifies(self) -> List[TransferNotify]:
        """The notifications received since the last call (each after its
        transfer's data arrived), oldest first."""
        self._drain()
        out: List[TransferNotify] = []
        with self._lock:
            while self._notifies:
                out.append(self._notifies.popleft())
        return out

    # The pump: drains tent's notification queue every _PUMP_SLICE_S, so that
    # control messages (a peer asking for the first buffer address) are
    # answered while the client is not calling in. It polls rather than
    # blocking in tent_notify_recv: a thread parked in that call for long
    # slows the engine's transfers measurably (about 15% at 64 KiB x 128).

    @staticmethod
    def _pump_loop(ref: "weakref.ReferenceType[TransferEngine]", stop: threading.Event) -> None:
        """The pump's loop. It holds the engine only weakly, so an engine
        dropped without close() is still finalized (and closed)."""
        while not stop.wait(_PUMP_SLICE_S):
            me = ref()
            if me is None or not me._drain():
                return
            del me

    def _drain(self) -> bool:
        """Takes every queued notification: client ones into the list
        get_notifies returns, control ones answered. False once the engine
        is closed. One drainer at a time keeps them in arrival order."""
        e = self._engine
        if e is None:
            return False
        with self._drain_lock:
            while True:
                try:
                    n = e.recv_notification(timeout=0)
                except tent.Timeout:
                    return True
                except (tent.InvalidHandle, tent.Closed, tent.ForkError):
                    return False  # the engine is closed (or unusable in this forked child)
                except Exception as exc:  # noqa: BLE001 - anything else is retried next round
                    logger.warning("receiving notifications: %s", exc)
                    return True
                self._dispatch(n)

    def _dispatch(self, n: tent.Notification) -> None:
        opened = _common.open_envelope(n.message)
        if opened is None:
            with self._lock:
                self._notifies.append(TransferNotify(n.sender, n.message.decode("utf-8", "replace")))
            return
        kind, name, body = opened
        if kind == _common.KIND_USER:
            with self._lock:
                self._notifies.append(TransferNotify(name, body.decode("utf-8", "replace")))
        elif kind == _common.KIND_QUERY:
            self._answer(n.sender, name)
        elif kind == _common.KIND_ANSWER:
            with self._answered:
                self._answers[name] = body
                self._answered.notify_all()

    def _answer(self, requester: str, nonce: str) -> None:
        with self._lock:
            first = self._order[0] if self._order else 0
        try:
            seg = self._need().open_segment(requester)
            try:
                self._need().notify(seg, _common.envelope(_common.KIND_ANSWER, nonce,
                                                          json.dumps({"first_buffer": first}).encode()))
            finally:
                seg.close()
        except Exception as exc:  # noqa: BLE001 - the asker times out and says so
            logger.warning("cannot answer %s's buffer query: %s", requester, exc)

    def _ask_first_buffer(self, segment_name: str) -> int:
        import uuid

        e = self._need()
        seg = self._segment(segment_name)
        nonce = uuid.uuid4().hex
        e.notify(seg, _common.envelope(_common.KIND_QUERY, nonce, b""))
        wait = _common.timeout() or _DEFAULT_DEADLINE_S
        with self._answered:
            if not self._answered.wait_for(lambda: nonce in self._answers, wait):
                raise tent.Timeout(f"{segment_name} did not answer within {wait} s")
            body = self._answers.pop(nonce)
        return int(json.loads(body)["first_buffer"])

    # ---- topology ----

    @_pybind.method(_OWNER, "str", _cstr("device_name", None))
    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """The machine's topology as JSON (tent's: GPUs from NVML)."""
        try:
            return json.dumps(tent.topology())
        except Exception as exc:  # noqa: BLE001
            self._fail("get_local_topology", exc)
            return "{}"

    # ---- teardown (tent addition; Mooncake releases at destruction) ----

    def close(self) -> None:
        """Releases everything: batches, segments, memory, the engine (and
        withdraws the HTTP metadata record). Idempotent."""
        self._stop.set()
        with self._lock:
            engine, self._engine = self._engine, None
            batches, self._batches = list(self._batches.values()), {}
            segments, self._segments = list(self._segments.values()), {}
            regions, self._regions = list(self._regions.values()), {}
            managed, self._managed = list(self._managed.values()), {}
            self._order = []
        if engine is None:
            return
        for obj in batches + segments + regions + managed:
            _close_quietly(obj)
        if self._http is not None:
            try:
                self._http.withdraw_segment(self._segment_name)
            except Exception as exc:  # noqa: BLE001
                logger.warning("cannot withdraw %s from %s: %s", self._segment_name, self._http.url, exc)
        engine.close()
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join()

    def __enter__(self) -> "TransferEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer never raises
            pass


def _close_quietly(obj: Any) -> None:
    try:
        obj.close()
    except Exception as exc:  # noqa: BLE001
        logger.warning("releasing %r: %s", obj, exc)


def _location(location: Optional[str]) -> Optional[str]:
    if not location or location == "*":
        return None
    return location


def _op(opcode: int) -> str:
    return "read" if opcode == TransferOpcode.Read else "write"


def _null_target(*lists: Any) -> RuntimeError:
    """What Mooncake raises for target_hostname=None: its bindings pass
    None as a null ``const char *``, and every transfer method's first use
    of it (a lookup in its segment cache, a std::string) throws
    std::logic_error, which pybind11 raises as RuntimeError. The lists are
    converted first (a bad element is still the bindings' TypeError)."""
    for values in lists:
        _pybind.uints(values)
    return RuntimeError("basic_string: construction from null is not valid")


def _hint(hint: str) -> Optional[str]:
    """Mooncake's transport_hint as tent's transport (None: tent chooses)."""
    h = (hint or "").strip().lower()
    return h if h in _common.TENT_TRANSPORTS else None
