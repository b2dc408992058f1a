"""NIXL's ``nixl_agent`` Python API on tent.

Same names, arguments, state strings ("DONE"/"PROC"/"ERR") and
exceptions (``nixl._bindings``' error classes) as ``nixl._api``, so
vLLM's NixlConnector and SGLang's nixl backend run unchanged::

    agent = nixl_agent("prefill-0", nixl_agent_config(backends=["UCX"]))
    agent.register_memory(agent.get_reg_descs(kv_blocks, "DRAM"))
    blob = agent.get_agent_metadata()          # carried over the client's side channel
    peer = other.add_remote_agent(blob)
    ...
    handle = agent.make_prepped_xfer("READ", local, ids, remote, ids, b"req-7")
    agent.transfer(handle)                     # "PROC"
    agent.check_xfer_state(handle)             # ... "DONE"

Underneath is one ``tent.Engine`` per agent (tent's peer-to-peer
metadata; its address is ``TENT_COMPAT_HOST``, default 127.0.0.1, on any
port). Backends ("UCX", "LIBFABRIC", ...) are served by the best tent
transport per peer, said once in the log; backend names tent has ("TCP",
"SHM") restrict it to those. A transfer's notification reaches the peer
after the data (tent's notify), keyed by this agent's name. Metadata
blobs and serialized descriptors are tent's versioned encoding
(``tent.compat._blob``), signed when ``TENT_COMPAT_SECRET`` is set, never
pickle. Every failure raises NIXL's exception class for it, with tent's
message and the tent exception as ``tent_error``.
"""

from __future__ import annotations

import array
import base64
import ctypes
import enum
import os
import socket
import struct
import sys
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

import tent
from tent import _lib

from .. import _blob, _common
from . import _bindings as nixlBind
from ._bindings import (
    nixlBackendError,
    nixlCancelledError,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotPostedError,
    nixlNotSupportedError,
    nixlRegDList,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
    nixlXferDList,
    nixlXferTelemetry,
)
from .logging import get_logger

logger = get_logger("_api")  # "nixl.api", as NIXL names its logger

DEFAULT_COMM_PORT = nixlBind.DEFAULT_COMM_PORT
nixl_backend_handle = int

_MEMS = {"DRAM": nixlBind.DRAM_SEG, "VRAM": nixlBind.VRAM_SEG, "FILE": nixlBind.FILE_SEG,
         "BLOCK": nixlBind.BLK_SEG, "OBJ": nixlBind.OBJ_SEG, "cpu": nixlBind.DRAM_SEG, "cuda": nixlBind.VRAM_SEG}
_OPS = {"WRITE": "write", "READ": "read"}
_MAX_FRAME = 16 << 20
_SIDE_CHANNEL_TIMEOUT_S = 5.0
# check_xfer_state: polls closer together than this are a spinning client,
# answered by a blocking wait of at most _SPIN_WAIT_MS. The wait ends the
# moment the transfer does; its bound matters because a waiter copies on
# its own thread (shm) only what it can finish before the bound: at 1 ms,
# a 8 MiB batch was handed on to a job goroutine part-way and finished
# twice as late as with an untimed wait (20 ms: as fast).
_SPIN_GAP_S = 0.0002
# make_prepped_xfer's cache of checked columns, per local descriptor list.
_PREPPED_CACHE = 16
_SPIN_WAIT_MS = 20  # the default; TENT_COMPAT_SPIN_WAIT_MS (0: never wait)
_NO_ENTRIES = ctypes.c_size_t(0)  # never modified


def _is_torch_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def nixl_error(exc: BaseException, what: str = "") -> nixlBind._nixlError:
    """The NIXL exception for a tent (or argument) error, tent's message kept."""
    if isinstance(exc, nixlBind._nixlError):
        return exc
    if isinstance(exc, _blob.BlobError):
        cls: type = nixlNotAllowedError if "secret" in str(exc) or "signature" in str(exc) else nixlInvalidParamError
    elif isinstance(exc, tent.NotFound):
        cls = nixlNotFoundError
    elif isinstance(exc, (tent.PermissionDenied, tent.AuthError)):
        cls = nixlNotAllowedError
    elif isinstance(exc, tent.Unsupported):
        cls = nixlNotSupportedError
    elif isinstance(exc, tent.VersionMismatch):
        cls = nixlMismatchError
    elif isinstance(exc, tent.Canceled):
        cls = nixlCancelledError
    elif isinstance(exc, (tent.TransportError, tent.Closed)):
        cls = nixlRemoteDisconnectError
    elif isinstance(exc, (tent.InvalidArgument, tent.InvalidHandle, tent.NotRegistered, tent.OutOfRange,
                          tent.Overlap, tent.AlreadyRegistered, TypeError, ValueError, IndexError)):
        cls = nixlInvalidParamError
    else:
        cls = nixlBackendError
    msg = f"{cls.status.name}: {what + ': ' if what else ''}{exc}"  # type: ignore[attr-defined]
    err = cls(msg, exc)
    err.__cause__ = exc
    return err


__all__ = ["DEFAULT_COMM_PORT", "nixl_agent", "nixl_agent_config", "nixl_backend_handle",
           "nixl_prepped_dlist_handle", "nixl_thread_sync_t", "nixl_xfer_handle"]


# ---- handles ------------------------------------------------------------------


class _agent_handle:
    """A handle an agent gave out; ``release()`` hands it back once."""

    __slots__ = ("_handle", "_agent", "_released")

    def __init__(self, agent: "nixl_agent", value: int) -> None:
        self._handle = int(value)
        self._agent = agent
        self._released = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(0x{self._handle:x}, released={self._released})"

    def _give_back(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        if not self._released:
            self._give_back()
            self._released = True

    def _unreleased_at_exit(self) -> None:
        """What a finalizer does when release failed (it never raises)."""

    def __del__(self) -> None:
        if self._released:
            return
        try:
            self.release()
        except Exception:  # noqa: BLE001 - a finalizer never raises
            try:
                self._unreleased_at_exit()
            except Exception:  # noqa: BLE001
                pass


class nixl_prepped_dlist_handle(_agent_handle):  # noqa: N801 - NIXL's names
    """A prepared descriptor list (prep_xfer_dlist). ``release()`` frees it."""

    __slots__ = ()

    def _give_back(self) -> None:
        self._agent._release_dlist(self._handle)


class nixl_xfer_handle(_agent_handle):  # noqa: N801
    """A transfer request (make_prepped_xfer / initialize_xfer). ``release()``
    cancels it if still running and frees it."""

    __slots__ = ()

    def _give_back(self) -> None:
        self._agent._release_xfer(self._handle)

    def _unreleased_at_exit(self) -> None:
        self._agent._leaked_xfer_handles.append(self._handle)


class nixl_thread_sync_t(enum.Enum):  # noqa: N801
    NIXL_THREAD_SYNC_NONE = nixlBind.NIXL_THREAD_SYNC_NONE
    NIXL_THREAD_SYNC_STRICT = nixlBind.NIXL_THREAD_SYNC_STRICT
    NIXL_THREAD_SYNC_RW = nixlBind.NIXL_THREAD_SYNC_RW
    NIXL_THREAD_SYNC_DEFAULT = nixlBind.NIXL_THREAD_SYNC_DEFAULT  # an alias of NONE, as in NIXL


class nixl_agent_config:  # noqa: N801
    """NIXL's agent configuration. tent uses ``enable_listen_thread`` /
    ``listen_port`` (the metadata side channel), ``capture_telemetry`` and
    ``backends`` (which tent transports serve); ``enable_prog_thread``,
    ``num_threads`` and ``sync_mode`` are accepted (tent's engine is
    always thread-safe and progresses on its own)."""

    def __init__(self, enable_prog_thread: bool = True, enable_listen_thread: bool = False,
                 listen_port: int = DEFAULT_COMM_PORT, capture_telemetry: bool = False, num_threads: int = 0,
                 backends: Optional[List[str]] = None, sync_mode: Optional[nixl_thread_sync_t] = None) -> None:
        self.backends = list(backends) if backends is not None else ["UCX"]
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(f"sync_mode must be a nixl_thread_sync_t (got {type(sync_mode).__name__!r})")
        self.sync_mode = sync_mode


# ---- internal records -------------------------------------------------------------


class _Regions:
    """Sorted (addr, len) ranges with a vectorized containment test."""

    def __init__(self, rows: Iterable[Tuple[int, int, int, int]] = ()) -> None:
        self.items: List[Tuple[int, int, int, int]] = sorted(set(rows))  # (addr, len, dev, mem)
        self._index: Any = None

    def merged(self, more: Iterable[Tuple[int, int, int, int]]) -> "_Regions":
        return _Regions(list(self.items) + list(more))

    def without(self, drop: Iterable[Tuple[int, int, int, int]]) -> "_Regions":
        gone = set(drop)
        return _Regions(r for r in self.items if r not in gone)

    def contains(self, rows: Any) -> Any:
        """A bool per (addr, len, dev) row: inside one region."""
        import numpy as np

        if self._index is None:
            self._index = (np.array([r[0] for r in self.items], dtype=np.uint64),
                           np.array([r[0] + r[1] for r in self.items], dtype=np.uint64))
        starts, ends = self._index
        if rows.shape[0] == 0:
            return np.ones(0, dtype=bool)
        if starts.shape[0] == 0:
            return np.zeros(rows.shape[0], dtype=bool)
        addr, length = rows[:, 0], rows[:, 1]
        i = np.searchsorted(starts, addr, side="right").astype(np.int64) - 1
        ok = i >= 0
        j = np.where(ok, i, 0)
        return ok & (addr + length <= ends[j]) & (addr + length >= addr)


class _Remote:
    def __init__(self, name: str, segment_name: str, regions: _Regions) -> None:
        self.name = name
        self.segment_name = segment_name
        self.regions = regions
        self.segment: Optional[tent.Segment] = None


class _Dlist:
    """A prepared descriptor list: its rows, and their addresses and lengths
    as two contiguous columns, which make_prepped_xfer gathers from."""

    def __init__(self, agent: Optional[str], rows: Any, mem: Any) -> None:
        import numpy as np

        self.agent = agent  # None: local (NIXL_INIT_AGENT)
        self.rows = rows
        self.mem = mem
        self.addrs = np.ascontiguousarray(rows[:, 0], dtype=np.uint64)
        self.lens = np.ascontiguousarray(rows[:, 1], dtype=np.uint64)
        # make_prepped_xfer's columns by (remote list's handle, local and
        # remote indices as int64 bytes): checked once, read-only, shared by
        # every transfer made of the same pair (a client that moves the
        # same blocks again and again). At most _PREPPED_CACHE, oldest out.
        self.prepped: Dict[Tuple[int, bytes, bytes], Tuple[Any, int]] = {}  # (columns, their address)


class _Xfer:
    """A transfer request: its columns (local addresses, remote addresses,
    lengths; checked when made, a C-contiguous 3 x n array at addr, which
    every post hands to tent as they are) and, once posted, its tent batch."""

    __slots__ = ("op", "remote", "cols", "addr", "notif", "batch", "start_us", "post_us", "xfer_us", "finished",
                 "polled")

    def __init__(self, op: str, remote: str, cols: Any, addr: int, notif: bytes) -> None:
        self.op = op
        self.remote = remote
        self.cols = cols
        self.addr = addr
        self.notif = notif
        self.batch: Optional[tent.Batch] = None
        self.start_us = 0
        self.post_us = 0
        self.xfer_us = 0
        self.finished = False
        self.polled = 0.0  # time.monotonic() of the last "PROC" answer


def _index_key(values: Any) -> Optional[bytes]:
    """Indices given as a list, as int64 bytes (the key of a _Dlist's
    prepped cache); None for any other type, or a list _indices refuses."""
    if type(values) is not list:
        return None
    try:
        return array.array("q", values).tobytes()
    except (TypeError, OverflowError):
        return None


def _indices(np: Any, values: Any) -> Any:
    """Descriptor indices as a 1-D int64 array: integers only (a float
    index would be truncated silently by an int64 conversion)."""
    if type(values) is list:
        # The common case (a connector's block ids): one C loop, which
        # refuses floats and values past int64 itself.
        try:
            return np.frombuffer(array.array("q", values), dtype=np.int64)
        except (TypeError, OverflowError):
            raise nixlInvalidParamError("make_prepped_xfer: indices must be integers") from None
    try:
        arr = np.asarray(values)
        if arr.size == 0:
            return arr.astype(np.int64).reshape(-1)
        if arr.dtype.kind not in "iu":
            raise TypeError(arr.dtype)
        return arr.astype(np.int64).reshape(-1)
    except (TypeError, ValueError, OverflowError):
        raise nixlInvalidParamError("make_prepped_xfer: indices must be integers") from None


def _mem_name(mem: Any) -> str:
    return "VRAM" if int(mem) == int(nixlBind.VRAM_SEG) else "DRAM"


# ---- the agent ------------------------------------------------------------------


class nixl_agent:  # noqa: N801
    """NIXL's agent, served by tent (see the module doc). ``close()``
    (a tent addition) releases everything at once."""

    def __init__(self, agent_name: str, nixl_conf: Optional[nixl_agent_config] = None,
                 instantiate_all: bool = False) -> None:
        if not isinstance(agent_name, str) or not agent_name:
            raise ValueError("an agent needs a non-empty name")  # NIXL: std::invalid_argument
        if nixl_conf and instantiate_all:
            logger.warning("Ignoring instantiate_all based on the provided config in agent creation.")
        conf = nixl_conf or nixl_agent_config()
        self.name = agent_name
        self._conf = conf
        self._lock = threading.RLock()
        self._secret = _common.secret()
        wait_ms = _common.spin_wait_ms(_SPIN_WAIT_MS)
        # for the untyped call; never modified
        self._spin_wait: Optional[ctypes.c_int64] = ctypes.c_int64(wait_ms) if wait_ms else None
        self._leaked_xfer_handles: List[int] = []
        self.notifs: Dict[str, List[bytes]] = {}
        # notifications dropped because their agent name belongs to another
        # engine here (_impersonates); tent's addition
        self.notifs_refused = 0
        self._refused_senders: Set[Tuple[str, str]] = set()
        self.backends: Dict[str, int] = {}
        self.backend_mems: Dict[str, List[str]] = {}
        self.backend_options: Dict[str, Dict[str, str]] = {}
        default_sync = (nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT if conf.enable_listen
                        else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE)
        agent_config = nixlBind.nixlAgentConfig()
        agent_config.useProgThread = conf.enable_pthread
        agent_config.useListenThread = conf.enable_listen
        agent_config.listenPort = conf.port
        agent_config.syncMode = (conf.sync_mode or default_sync).value
        agent_config.captureTelemetry = conf.capture_telemetry
        self.agent = nixlBind.nixlAgent(agent_name, agent_config)  # looked up now: tests may wrap it
        self._telemetry = bool(self.agent.captureTelemetry)
        self.plugin_list = list(self.agent.getAvailPlugins())
        self.plugin_b_options: Dict[str, Dict[str, str]] = {}
        self.plugin_mem_types: Dict[str, List[str]] = {}
        self.nixl_mems = dict(_MEMS)
        self.nixl_ops = {"WRITE": nixlBind.NIXL_WRITE, "READ": nixlBind.NIXL_READ}

        if instantiate_all and not nixl_conf:
            conf.backends = list(self.plugin_list)
        served = []
        for b in conf.backends:
            if b in self.plugin_list:
                served.append(b)
            else:  # as NIXL does for a plugin it does not have
                logger.warning("Skipping backend registration %s due to the missing plugin.", b)
        wanted = [b for b in served if b.lower() in _common.TENT_TRANSPORTS]
        transports, _ = _common.transports_for(",".join(b.lower() for b in wanted) if wanted else None)
        foreign = [b for b in served if b.lower() not in _common.TENT_TRANSPORTS]
        if foreign and not wanted:
            logger.warning("backends %s are served by tent: the best transport tent has for each peer "
                           "(local in-process, shm on the same host, tcp across hosts)", foreign)
        host = os.environ.get("TENT_COMPAT_HOST", "127.0.0.1")
        self._engine = tent.Engine(listen_addr=f"{host}:0", transports=transports, secret=self._secret,
                                   timeout=_common.timeout())
        self._handles = 0
        self._regions = _Regions()
        self._registered: Dict[Tuple[int, int], tent.Region] = {}
        # how many register_memory calls hold each region: NIXL registers a
        # descriptor again each time it is given, and each is deregistered once
        self._holds: Dict[Tuple[int, int], int] = {}
        self._remotes: Dict[str, _Remote] = {}
        self._dlists: Dict[int, _Dlist] = {}
        self._xfers: Dict[int, _Xfer] = {}
        self._self_segment: Optional[tent.Segment] = None
        for b in served:
            self.create_backend(b)
        self._listener: Optional[_Listener] = None
        if conf.enable_listen:
            self._listener = _Listener(self, host, int(conf.port))
        logger.info("Initialized NIXL agent: %s (tent engine %s)", agent_name, self._engine.name)

    # ---- tent additions ----

    @property
    def tent_engine(self) -> tent.Engine:
        """The tent.Engine underneath."""
        return self._engine

    @property
    def listen_port(self) -> int:
        """The side channel's port (with enable_listen_thread; 0 otherwise)."""
        return self._listener.port if self._listener is not None else 0

    def close(self) -> None:
        """Releases transfers, descriptor lists, registrations, peers and the
        engine. Idempotent."""
        # The listen thread is stopped first and outside the agent's lock:
        # a request it is serving (a peer's invalidate or send) takes that
        # lock, so joining the thread while holding it would deadlock.
        with self._lock:
            if self._engine.closed:
                return
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            if self._engine.closed:
                return
            for x in self._xfers.values():
                if x.batch is not None:
                    _close_quietly(x.batch)
            self._xfers.clear()
            self._dlists.clear()
            for r in self._remotes.values():
                if r.segment is not None:
                    _close_quietly(r.segment)
            self._remotes.clear()
            if self._self_segment is not None:
                _close_quietly(self._self_segment)
            for region in self._registered.values():
                _close_quietly(region)
            self._registered.clear()
            self._holds.clear()
            self._engine.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _next(self) -> int:
        self._handles += 1
        return self._handles

    # ---- plugins and backends ----

    def get_plugin_list(self) -> List[str]:
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend: str) -> List[str]:
        """The memory types of a plugin ([] for one tent does not serve)."""
        if backend not in self.plugin_list:
            logger.warning("Plugin %s is not available to get its supported mem types.", backend)
            return []
        return self.plugin_mem_types.setdefault(backend, ["DRAM", "VRAM"])

    def get_plugin_params(self, backend: str) -> Dict[str, str]:
        """A plugin's init parameters ({} for one tent does not serve)."""
        if backend not in self.plugin_list:
            logger.warning("Plugin %s is not available to get its parameters.", backend)
            return {}
        return self.plugin_b_options.setdefault(backend, {})

    def get_backend_mem_types(self, backend: str) -> List[str]:
        """An instantiated backend's memory types ([] for one not created)."""
        if backend not in self.backend_mems:
            logger.warning("Backend %s not instantiated to get its supported mem types.", backend)
            return []
        return self.backend_mems[backend]

    def get_backend_params(self, backend: str) -> Dict[str, str]:
        """An instantiated backend's parameters ({} for one not created)."""
        if backend not in self.backend_options:
            logger.warning("Backend %s not instantiated to get its parameters.", backend)
            return {}
        return self.backend_options[backend]

    def create_backend(self, backend: str, initParams: Optional[Dict[str, str]] = None) -> None:  # noqa: N803
        """Records the backend (tent's transports serve every plugin in
        ``plugin_list``); a name not in it is nixlNotFoundError, as NIXL
        answers for a plugin it does not have."""
        if backend not in self.plugin_list:
            raise nixlNotFoundError(f"NIXL_ERR_NOT_FOUND: no plugin {backend!r} (tent serves {self.plugin_list})")
        with self._lock:
            self.backends[backend] = len(self.backends) + 1
            self.backend_mems[backend] = ["DRAM", "VRAM"]
            self.backend_options[backend] = dict(initParams or {})

    def _check_backends(self, backends: Any) -> None:
        """backends as NIXL's releases pass them: a list of names, one name
        (the older ``backend=`` / ``xfer_backend=``), or None. A bool here is
        the older releases' positional ``is_unified_addr``: nothing to check."""
        if backends is None or isinstance(backends, bool):
            return
        if isinstance(backends, str):
            backends = [backends]
        try:
            names = list(backends)
        except TypeError:
            raise TypeError(f"backends must be a list of backend names, not {type(backends).__name__}") from None
        for b in names:
            if b not in self.backends:
                raise KeyError(b)

    # ---- descriptor lists ----

    def get_reg_descs(self, descs: Any, mem_type: Optional[str] = None, is_unified_addr: bool = True,
                      is_sorted: bool = False) -> Optional[nixlRegDList]:
        """A nixlRegDList from (addr, len, dev, meta) tuples with a mem type,
        an Nx3 numpy array with a mem type, a tensor, a list of tensors, or
        (tent addition) any other buffer object (numpy data arrays).
        ``is_unified_addr`` and ``is_sorted`` (older releases' lookup hints)
        are accepted and change nothing: tent indexes the ranges itself."""
        return self._descs(nixlRegDList, descs, mem_type, 4)

    def get_xfer_descs(self, descs: Any, mem_type: Optional[str] = None, is_unified_addr: bool = True,
                       is_sorted: bool = False) -> Optional[nixlXferDList]:
        """A nixlXferDList from (addr, len, dev) tuples with a mem type, an Nx3
        numpy array with a mem type, a tensor or a list of tensors
        (``is_unified_addr`` / ``is_sorted``: as in get_reg_descs)."""
        return self._descs(nixlXferDList, descs, mem_type, 3)

    def _descs(self, cls: type, descs: Any, mem_type: Optional[str], width: int) -> Any:
        import numpy as np

        other = nixlXferDList if cls is nixlRegDList else nixlRegDList
        if isinstance(descs, cls):
            return descs
        if isinstance(descs, other):
            logger.error("%s type detected, please use %s", other.__name__, cls.__name__)
            return None
        if _is_torch_tensor(descs):
            return self._tensor_descs(cls, [descs], width)
        if isinstance(descs, np.ndarray):
            if descs.ndim == 2 and descs.shape[1] == 3 and descs.dtype.kind in "iu":
                if mem_type is None:
                    logger.error("Please specify a mem type if not using Tensors")
                    return None
                return cls(self._mem(mem_type), descs)
            buf = tent.resolve(descs)  # a data array: its memory, one descriptor
            row = (buf.ptr, buf.nbytes, 0, "") if width == 4 else (buf.ptr, buf.nbytes, 0)
            return cls(self._mem(mem_type or "DRAM"), [row])
        if isinstance(descs, (list, tuple)) and descs:
            first = descs[0]
            if isinstance(first, tuple):
                if mem_type is None:
                    logger.error("Please specify a mem type if not using Tensors")
                    return None
                if len(first) != width:
                    logger.error("%d-tuple list needed", width)
                    return None
                return cls(self._mem(mem_type), list(descs))
            if _is_torch_tensor(first):
                return self._tensor_descs(cls, list(descs), width)
        return None

    def _mem(self, mem_type: str) -> Any:
        return self.nixl_mems[mem_type]  # an unknown type is a KeyError, as in NIXL

    def _tensor_descs(self, cls: type, tensors: List[Any], width: int) -> Any:
        rows = []
        dev0 = tensors[0].device
        for t in tensors:
            if t.device != dev0:
                return None
            if not t.is_contiguous():
                logger.error("Please use a list of contiguous Tensors")
                return None
            gpu = t.get_device()
            gpu = 0 if gpu == -1 else gpu
            row = (t.data_ptr(), t.numel() * t.element_size(), gpu)
            rows.append(row + ("",) if width == 4 else row)
        mem = "DRAM" if tensors[0].get_device() == -1 else "VRAM"
        return cls(self.nixl_mems[mem], rows)

    def get_remote_descs(self, descs: Any, mem_type: Optional[str] = None) -> Any:
        if isinstance(descs, nixlBind.nixlRemoteDList):
            return descs
        if isinstance(descs, (list, tuple)) and descs and isinstance(descs[0], tuple) and mem_type is not None:
            return nixlBind.nixlRemoteDList(self._mem(mem_type), list(descs))
        logger.error("4-tuple list (addr, len, dev_id, agent_name) with a mem type needed for remote descriptors")
        return None

    def get_serialized_descs(self, descs: Any) -> bytes:
        """A descriptor list as bytes, in tent's encoding (not pickle)."""
        if not isinstance(descs, nixlBind._DList):
            raise nixlInvalidParamError(f"not a NIXL descriptor list: {type(descs).__name__}")
        rows: List[List[Any]] = [list(d) for d in descs]
        body: Dict[str, Any] = {"list": descs._kind, "type": int(descs.getType()), "descs": rows}
        if descs._kind == "reg":  # meta info is bytes: carried as base64 text
            for r in rows:
                r[3] = _b64(r[3])
            body["meta"] = "b64"
        return _blob.encode("nixl-descs", body, self._secret)

    def deserialize_descs(self, serialized_descs: bytes) -> Any:
        try:
            _, body = _blob.decode(serialized_descs, self._secret, "nixl-descs")
            cls = {"xfer": nixlXferDList, "reg": nixlRegDList, "remote": nixlBind.nixlRemoteDList}[body["list"]]
            rows = [list(d) for d in body["descs"]]
            if body.get("meta") == "b64":
                for r in rows:
                    r[3] = base64.b64decode(r[3], validate=True)
            return cls(body["type"], [tuple(r) for r in rows])
        except nixlBind._nixlError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise nixl_error(exc, "deserialize_descs") from None

    # ---- memory ----

    def register_memory(self, reg_list: Any, mem_type: Optional[str] = None,
                        backends: Optional[List[str]] = None, *, is_unified_addr: bool = True,
                        is_sorted: bool = False, backend: Optional[str] = None) -> nixlRegDList:
        """Registers every descriptor with tent, all or none. Returns the
        nixlRegDList (for deregister_memory). ``backend`` is the older
        releases' single backend name."""
        self._check_backends(backends)
        self._check_backends(backend)
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError("register_memory: no descriptors (see the log for why)")
        mem = descs.getType()
        if int(mem) not in (int(nixlBind.DRAM_SEG), int(nixlBind.VRAM_SEG)):
            raise nixlNotSupportedError(f"tent registers DRAM and VRAM, not {mem.name}")
        items = [(int(a), int(n), int(d)) for a, n, d in descs.rows]
        with self._lock:
            fresh: List[Tuple[int, int, int]] = []
            for it in items:  # a region given again (here or before) is held again, not registered twice
                if (it[0], it[1]) not in self._registered and all(f[:2] != it[:2] for f in fresh):
                    fresh.append(it)
            loc = (lambda dev: "cpu") if int(mem) == int(nixlBind.DRAM_SEG) else (lambda dev: f"cuda:{dev}")
            try:
                regions = self._engine.register_batch([((a, n), loc(d)) for a, n, d in fresh]) if fresh else []
            except Exception as exc:  # noqa: BLE001
                raise nixl_error(exc, "register_memory") from None
            for (a, n, d), r in zip(fresh, regions):
                self._registered[(a, n)] = r
            for a, n, _ in items:
                self._holds[(a, n)] = self._holds.get((a, n), 0) + 1
            self._regions = self._regions.merged((a, n, d, int(mem)) for a, n, d in fresh)
        return descs

    def deregister_memory(self, dereg_list: nixlRegDList, backends: Optional[List[str]] = None) -> None:
        """Unregisters the descriptors (waiting for transfers still using them)."""
        self._check_backends(backends)
        if not isinstance(dereg_list, nixlRegDList):
            raise nixlInvalidParamError("deregister_memory takes the nixlRegDList register_memory returned")
        items = [(int(a), int(n), int(d)) for a, n, d in dereg_list.rows]
        with self._lock:
            wanted: Dict[Tuple[int, int], int] = {}
            for a, n, _ in items:
                wanted[(a, n)] = wanted.get((a, n), 0) + 1
            missing = [k for k, c in wanted.items() if self._holds.get(k, 0) < c]
            if missing:
                raise nixlNotFoundError(f"deregister_memory: {missing[0][0]:#x}+{missing[0][1]} is not registered")
            gone = {k for k, c in wanted.items() if self._holds[k] == c}
            try:
                if gone:
                    self._engine.unregister_batch([self._registered[k] for k in gone])
            except Exception as exc:  # noqa: BLE001
                raise nixl_error(exc, "deregister_memory") from None
            for k, c in wanted.items():
                self._holds[k] -= c
                if not self._holds[k]:
                    del self._holds[k], self._registered[k]
            self._regions = _Regions(r for r in self._regions.items if (r[0], r[1]) not in gone)

    def query_memory(self, reg_list: Any, backend: str, mem_type: Optional[str] = None) -> List[Optional[Dict[str, str]]]:
        """Per descriptor: None if this agent has not registered it, else
        {"mem_type", "registered"}."""
        if backend not in self.backends:
            raise ValueError(f"Backend '{backend}' not found. Available backends: {list(self.backends.keys())}")
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError("query_memory: no descriptors")
        with self._lock:
            ok = self._regions.contains(descs.rows)
        name = _mem_name(descs.getType())
        return [{"mem_type": name, "registered": "true"} if bool(x) else None for x in ok]

    # ---- remote agents and metadata ----

    def _metadata(self, rows: Optional[List[Tuple[int, int, int, int]]], conn: bool) -> bytes:
        with self._lock:
            regions = self._regions.items if rows is None else rows
            body = {"agent": self.name, "regions": [list(r) for r in regions]}
            if conn:
                body["segment"] = self._engine.name
        return _blob.encode("nixl-agent", body, self._secret)

    def get_agent_metadata(self) -> bytes:
        """This agent's metadata (its tent address and registrations) as
        bytes, for the client's side channel."""
        return self._metadata(None, True)

    def get_partial_agent_metadata(self, descs: nixlRegDList, inc_conn_info: bool = False,
                                   backends: Optional[List[str]] = None) -> bytes:
        """Metadata of the given registered descriptors only (and the tent
        address with inc_conn_info)."""
        self._check_backends(backends)
        if descs is None or not isinstance(descs, nixlRegDList):
            raise nixlInvalidParamError("get_partial_agent_metadata takes a nixlRegDList")
        with self._lock:
            ok = self._regions.contains(descs.rows)
            if not ok.all():
                raise nixlNotFoundError("get_partial_agent_metadata: a descriptor is not registered")
            rows = [(int(a), int(n), int(d), int(descs.getType())) for a, n, d in descs.rows]
        return self._metadata(rows, bool(inc_conn_info))

    def add_remote_agent(self, metadata: bytes) -> bytes:
        """Loads a peer's metadata blob; returns its agent name (bytes, as
        NIXL does; every call taking an agent name takes bytes or str)."""
        try:
            _, body = _blob.decode(metadata, self._secret, "nixl-agent")
            name = body["agent"]
            if not isinstance(name, str) or not name:
                raise ValueError("no agent name in the metadata")
            rows = [(int(a), int(n), int(d), int(m)) for a, n, d, m in body.get("regions", [])]
            segment = body.get("segment")
            if segment is not None and not isinstance(segment, str):
                raise ValueError("bad segment address in the metadata")
        except nixlBind._nixlError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise nixl_error(exc, "add_remote_agent") from None
        with self._lock:
            known = self._remotes.get(name)
            if known is None:
                if segment is None:
                    raise nixlNotFoundError(f"add_remote_agent: {name!r} is unknown and its metadata has no "
                                            "connection info (inc_conn_info=False)")
                self._remotes[name] = _Remote(name, segment, _Regions(rows))
            else:
                if segment is not None and segment != known.segment_name:
                    if known.segment is not None:
                        _close_quietly(known.segment)
                    known.segment, known.segment_name = None, segment
                    known.regions = _Regions(rows)
                else:
                    known.regions = known.regions.merged(rows)
        return name.encode()  # NIXL's bindings return the name as bytes

    def remove_remote_agent(self, agent: Any) -> None:
        """Forgets a remote agent and closes its connection. Removing one
        that is not known does nothing (NIXL's bindings drop the status of
        this call, so clients tear down twice without an error)."""
        agent = _agent_name(agent)
        with self._lock:
            r = self._remotes.pop(agent, None)
        if r is None:
            logger.debug("remove_remote_agent: %r is not a known remote agent", agent)
            return
        if r.segment is not None:
            _close_quietly(r.segment)

    def check_remote_metadata(self, agent: Any, descs: Optional[nixlXferDList] = None) -> bool:
        agent = _agent_name(agent)
        with self._lock:
            r = self._remotes.get(agent)
            if r is None:
                return False
            if descs is None or len(descs) == 0:
                return True
            return bool(r.regions.contains(descs.rows).all())

    def make_connection(self, remote_agent: str, backends: Optional[List[str]] = None) -> None:
        """Opens the tent segment to the peer ahead of the first transfer."""
        self._check_backends(backends)
        self._peer_segment(_agent_name(remote_agent))

    def _peer(self, agent: str) -> _Remote:
        r = self._remotes.get(agent)
        if r is not None:
            return r
        if agent == self.name:  # loopback
            return _Remote(self.name, self._engine.name, self._regions)
        raise nixlNotFoundError(f"{agent!r} is not a known remote agent (add_remote_agent / fetch_remote_metadata)")

    def _peer_segment(self, agent: str) -> tent.Segment:
        """The open tent segment to agent. Dialing happens outside the
        agent's lock, so a peer slow to answer delays only its own calls."""
        with self._lock:
            r = self._peer(agent)
            loopback = agent == self.name and agent not in self._remotes
            seg = self._self_segment if loopback else r.segment
            if seg is not None and not seg.closed:
                return seg
            address = self._engine.name if loopback else r.segment_name
        try:
            seg = self._engine.open_segment(address)
        except Exception as exc:  # noqa: BLE001
            raise nixl_error(exc, f"connecting to {agent!r}") from None
        with self._lock:
            if loopback:
                current, self._self_segment = self._self_segment, seg
            else:
                current = r.segment
                if self._remotes.get(agent) is not r or r.segment_name != address:
                    current = None  # removed or re-addressed meanwhile: this one is for the caller only
                else:
                    r.segment = seg
            if current is not None and not current.closed and current is not seg:
                # another thread connected first: keep its segment
                if loopback:
                    self._self_segment = current
                else:
                    r.segment = current
                _close_quietly(seg)
                return current
        return seg

    # -- side channel (listen thread) and etcd --

    def send_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        """Sends this agent's metadata to a peer's listen thread (ip_addr,
        port), or publishes it in etcd (NIXL_ETCD_ENDPOINTS) without ip_addr."""
        md = self.get_agent_metadata()
        if ip_addr:
            self._side_async("send", ip_addr, port, {"md": _b64(md)})
        else:
            self._etcd().put(self._etcd_key(self.name), md)

    def send_partial_agent_metadata(self, descs: nixlRegDList, inc_conn_info: bool = False,
                                    backends: Optional[List[str]] = None, ip_addr: str = "",
                                    port: int = DEFAULT_COMM_PORT, label: str = "") -> None:
        md = self.get_partial_agent_metadata(descs, inc_conn_info, backends)
        if ip_addr:
            self._side_async("send", ip_addr, port, {"md": _b64(md)})
        else:
            self._etcd().put(self._etcd_key(self.name, label), md)

    def fetch_remote_metadata(self, remote_agent: str, ip_addr: str = "", port: int = DEFAULT_COMM_PORT,
                              label: str = "") -> None:
        """Asks a peer's listen thread (or etcd) for remote_agent's metadata;
        it is loaded in the background: poll check_remote_metadata."""
        remote_agent = _agent_name(remote_agent)
        if ip_addr:
            self._side_async("fetch", ip_addr, port, {"agent": remote_agent})
            return
        etcd = self._etcd()

        def fetch() -> None:
            try:
                md = etcd.get(self._etcd_key(remote_agent, label))
                if md is None:
                    logger.error("fetch_remote_metadata: %s has no metadata in etcd", remote_agent)
                    return
                self.add_remote_agent(md)
            except Exception as exc:  # noqa: BLE001
                logger.error("fetch_remote_metadata(%s) from etcd: %s", remote_agent, exc)

        threading.Thread(target=fetch, name="tent-nixl-fetch", daemon=True).start()

    def invalidate_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        """Tells a peer (or etcd) to forget this agent."""
        if ip_addr:
            self._side_async("invalidate", ip_addr, port, {"agent": self.name})
        else:
            self._etcd().delete(self._etcd_key(self.name))

    def _etcd(self) -> Any:
        from .._etcd import EtcdKV

        eps = os.environ.get("NIXL_ETCD_ENDPOINTS")
        if not eps:
            raise nixlInvalidParamError("no ip_addr given and NIXL_ETCD_ENDPOINTS is not set")
        return EtcdKV(eps)

    @staticmethod
    def _etcd_key(agent: str, label: str = "") -> str:
        ns = os.environ.get("NIXL_ETCD_NAMESPACE", "/nixl/agents").rstrip("/")
        return f"{ns}/{agent}/{label or 'tent-metadata'}"

    def _side_async(self, op: str, ip: str, port: int, body: Dict[str, Any]) -> None:
        def run() -> None:
            try:
                reply = _side_call(ip, int(port), op, body, self._secret)
                if op == "fetch":
                    md = reply.get("md")
                    if not md:
                        logger.error("fetch_remote_metadata: %s:%s does not know %s", ip, port, body["agent"])
                        return
                    self.add_remote_agent(base64.b64decode(md))
            except Exception as exc:  # noqa: BLE001 - NIXL reports side-channel failures in its log
                logger.error("metadata %s with %s:%s: %s", op, ip, port, exc)

        threading.Thread(target=run, name=f"tent-nixl-{op}", daemon=True).start()

    def _serve_side(self, op: str, body: Dict[str, Any]) -> Dict[str, Any]:
        if op == "send":
            return {"ok": True, "agent": self.add_remote_agent(base64.b64decode(body["md"])).decode()}
        if op == "fetch":
            if body.get("agent") == self.name:
                return {"ok": True, "md": _b64(self.get_agent_metadata())}
            return {"ok": False, "md": ""}
        if op == "invalidate":
            try:
                self.remove_remote_agent(str(body.get("agent")))
            except nixlNotFoundError:
                pass
            return {"ok": True}
        return {"ok": False}

    # ---- transfers ----

    def prep_xfer_dlist(self, agent_name: str, xfer_list: Any, mem_type: Optional[str] = None,
                        backends: Optional[List[str]] = None, *, is_unified_addr: bool = True,
                        is_sorted: bool = False, xfer_backend: Any = None) -> nixl_prepped_dlist_handle:
        """Prepares descriptors for make_prepped_xfer: local ones
        ("NIXL_INIT_AGENT" or "") must be registered here, remote ones
        inside what the named agent registered."""
        self._check_backends(backends)
        self._check_backends(xfer_backend if isinstance(xfer_backend, str) else None)
        agent_name = _agent_name(agent_name)
        descs = self.get_xfer_descs(xfer_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError("prep_xfer_dlist: no descriptors (see the log for why)")
        local = agent_name in ("NIXL_INIT_AGENT", "")
        with self._lock:
            regions = self._regions if local else self._peer(agent_name).regions
            ok = regions.contains(descs.rows)
            if not ok.all():
                i = int(ok.argmin())
                a, n, _ = descs[i]
                whose = "this agent" if local else repr(agent_name)
                raise nixlNotFoundError(f"prep_xfer_dlist: descriptor {i} ({a:#x}+{n}) is not in memory {whose} "
                                        "registered")
            h = self._next()
            self._dlists[h] = _Dlist(None if local else agent_name, descs.rows.copy(), descs.getType())
        return nixl_prepped_dlist_handle(self, h)

    def _release_dlist(self, h: int) -> None:
        with self._lock:
            self._dlists.pop(h, None)

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle) -> None:
        handle.release()

    def make_prepped_xfer(self, operation: str, local_xfer_side: nixl_prepped_dlist_handle, local_indices: Any,
                          remote_xfer_side: nixl_prepped_dlist_handle, remote_indices: Any,
                          notif_msg: Union[bytes, str] = b"", backends: Optional[List[str]] = None,
                          skip_desc_merge: bool = False) -> nixl_xfer_handle:
        """A transfer of local descriptors [local_indices] to/from remote
        descriptors [remote_indices] (pairwise, equal lengths)."""
        import numpy as np

        op = self._op(operation)
        if backends is not None:
            self._check_backends(backends)
        lkey = _index_key(local_indices)
        rkey = lkey if remote_indices is local_indices else _index_key(remote_indices)
        key = (remote_xfer_side._handle, lkey, rkey) if lkey is not None and rkey is not None else None
        with self._lock:
            ld = self._dlists.get(local_xfer_side._handle)
            rd = self._dlists.get(remote_xfer_side._handle)
            if ld is None or rd is None:
                raise nixlInvalidParamError("make_prepped_xfer: a descriptor list handle was released")
            if ld.agent is not None or rd.agent is None:
                raise nixlInvalidParamError("make_prepped_xfer: local side must be prepared with NIXL_INIT_AGENT, "
                                            "the remote side with the remote (or this) agent's name")
            remote = rd.agent
            if remote not in self._remotes:
                self._peer(remote)  # raises unless it is this agent
            hit = ld.prepped.get(key) if key is not None else None
            if hit is not None:
                # checked when first made: registered at once, in this lock
                x = _Xfer(op, remote, hit[0], hit[1], _common.as_bytes(notif_msg) if notif_msg else b"")
                h = self._next()
                self._xfers[h] = x
                return nixl_xfer_handle(self, h)
        li, ri = _indices(np, local_indices), _indices(np, remote_indices)
        if li.shape != ri.shape:
            raise nixlInvalidParamError(f"make_prepped_xfer: {li.shape[0]} local and {ri.shape[0]} remote indices")
        n = li.shape[0]
        if n == 0:
            raise nixlInvalidParamError("a transfer needs at least one descriptor")
        # Gathered from the lists' cached columns straight into the
        # transfer's columns (local addresses, remote addresses, lengths).
        cols = np.empty((3, n), dtype=np.uint64)
        rlens = np.empty(n, dtype=np.uint64)
        try:
            if min(li.min(), ri.min()) < 0:
                raise IndexError("negative")
            ld.addrs.take(li, out=cols[0])  # raises IndexError past the end
            rd.addrs.take(ri, out=cols[1])
            ld.lens.take(li, out=cols[2])
            rd.lens.take(ri, out=rlens)
        except IndexError:
            raise nixlInvalidParamError(f"make_prepped_xfer: an index is outside its list of {ld.rows.shape[0]} "
                                        f"local / {rd.rows.shape[0]} remote descriptors") from None
        addr = int(cols.ctypes.data)
        handle = self._new_xfer(op, remote, cols, rlens, notif_msg, addr)  # checks the lengths
        if key is not None:
            cols.flags.writeable = False  # shared from now on
            with self._lock:
                if len(ld.prepped) >= _PREPPED_CACHE:
                    del ld.prepped[next(iter(ld.prepped))]
                ld.prepped[key] = (cols, addr)
        return handle

    def initialize_xfer(self, operation: str, local_descs: nixlXferDList, remote_descs: nixlXferDList,
                        remote_agent: str, notif_msg: Union[bytes, str] = b"",
                        backends: Optional[List[str]] = None, *, xfer_backend: Any = None) -> nixl_xfer_handle:
        """A transfer between two descriptor lists (pairwise), to remote_agent."""
        op = self._op(operation)
        self._check_backends(backends)
        self._check_backends(xfer_backend if isinstance(xfer_backend, str) else None)
        remote_agent = _agent_name(remote_agent)
        if not isinstance(local_descs, nixlXferDList) or not isinstance(remote_descs, nixlXferDList):
            raise nixlInvalidParamError("initialize_xfer takes two nixlXferDList (get_xfer_descs)")
        if len(local_descs) != len(remote_descs):
            raise nixlInvalidParamError(f"initialize_xfer: {len(local_descs)} local and {len(remote_descs)} "
                                        "remote descriptors")
        with self._lock:
            if not self._regions.contains(local_descs.rows).all():
                raise nixlNotFoundError("initialize_xfer: a local descriptor is not registered")
            if not self._peer(remote_agent).regions.contains(remote_descs.rows).all():
                raise nixlNotFoundError(f"initialize_xfer: a remote descriptor is not in memory {remote_agent!r} "
                                        "registered")
        import numpy as np

        n = len(local_descs)
        if n == 0:
            raise nixlInvalidParamError("a transfer needs at least one descriptor")
        cols = np.empty((3, n), dtype=np.uint64)
        cols[0], cols[1], cols[2] = local_descs.rows[:, 0], remote_descs.rows[:, 0], local_descs.rows[:, 1]
        return self._new_xfer(op, remote_agent, cols, remote_descs.rows[:, 1], notif_msg)

    def _op(self, operation: str) -> str:
        """'READ'/'WRITE' as tent's op; anything else is a KeyError (NIXL
        looks the name up in ``nixl_ops``), raised before any other check."""
        try:
            return _OPS[operation]
        except (KeyError, TypeError):
            raise KeyError(operation) from None

    def _new_xfer(self, op: str, remote: str, cols: Any, rlens: Any, notif: Any,
                  addr: Optional[int] = None) -> nixl_xfer_handle:
        """A transfer of cols (3 x n: local addresses, remote addresses,
        local lengths), whose remote descriptors' lengths are rlens (None:
        checked already)."""
        if rlens is not None and (cols[2] != rlens).any():
            i = int((cols[2] != rlens).argmax())
            raise nixlInvalidParamError(f"descriptor pair {i}: local length {int(cols[2, i])} != remote length "
                                        f"{int(rlens[i])}")
        x = _Xfer(op, remote, cols, int(cols.ctypes.data) if addr is None else addr,
                  _common.as_bytes(notif) if notif else b"")
        with self._lock:
            h = self._next()
            self._xfers[h] = x
        return nixl_xfer_handle(self, h)

    def _xfer(self, handle: nixl_xfer_handle) -> _Xfer:
        x = self._xfers.get(handle._handle) if isinstance(handle, nixl_xfer_handle) else None
        if x is None or handle._released:
            raise nixlInvalidParamError("the transfer handle is released or not this agent's")
        return x

    def transfer(self, handle: nixl_xfer_handle, notif_msg: Union[bytes, str] = b"") -> str:
        """Posts the transfer: "PROC" (or "DONE" when already finished).
        Reposting a finished transfer moves the data again; reposting one
        still running raises nixlRepostActiveError."""
        x = self._xfer(handle)
        if x.batch is not None:
            if not x.finished and not x.batch.done:
                raise nixlRepostActiveError("the transfer is still running")
            _close_quietly(x.batch)
            x.batch = None
        msg = _common.as_bytes(notif_msg) if notif_msg else x.notif
        t0 = time.time_ns()
        try:
            r = self._remotes.get(x.remote)
            seg = r.segment if r is not None else None
            if seg is None or seg.closed:
                seg = self._peer_segment(x.remote)  # connects (or this agent's own segment)
            opts = (_common.transfer_options(self._engine, _common.envelope(_common.KIND_USER, self.name, msg), None)
                    if msg else _common.NO_OPTS)
            x.batch = _common.transfer_columns(self._engine, x.op, seg, x.cols, x.addr, opts)
        except nixlBind._nixlError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise nixl_error(exc, f"transfer to {x.remote!r}") from None
        t1 = time.time_ns()
        x.start_us, x.post_us, x.xfer_us, x.finished = t0 // 1000, (t1 - t0) // 1000, 0, False
        return "PROC"

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        """"PROC" while running, "DONE" once all data arrived; a failed
        transfer raises its NIXL error (nixlRemoteDisconnectError when the
        peer went away, ...) with tent's message.

        A client polling in a tight loop (again within _SPIN_GAP_S) is
        answered by a short blocking wait instead (at most _SPIN_WAIT_MS, or
        TENT_COMPAT_SPIN_WAIT_MS; 0 turns it off),
        which returns the moment the batch finishes: the same answer,
        without a core spent spinning that tent's copies need, and the
        polling thread is lent to the transport (shm copies on it). Polls
        spaced further apart (a scheduler's step) never block."""
        x = self._xfer(handle)
        batch = x.batch
        if batch is None:
            raise nixlNotPostedError("the transfer was not posted")
        if x.finished:
            return "DONE"
        now = time.monotonic()
        spinning = self._spin_wait is not None and now - x.polled < _SPIN_GAP_S
        x.polled = now
        engine = self._engine
        if engine._handle is not None and batch._handle is not None:
            # One call into the library answers the common cases: done,
            # or still running when merely polled.
            if spinning:
                st = engine._fast.tent_batch_wait(batch._handle_arg, self._spin_wait)
            else:
                st = engine._fast.tent_batch_status(batch._handle_arg, None, _NO_ENTRIES, None)
            if st == _lib.TENT_OK:
                return self._finished(x)
            if st == _lib.TENT_PENDING:
                return "PROC"
            if st == _lib.TENT_ERR_TIMEOUT and spinning:
                # still running when the wait ended, or finished with a
                # request that timed out: the batch tells which
                x.polled = time.monotonic()
        try:
            if not batch.done:
                return "PROC"
            batch.wait(0)  # raises a failed request's error (or the call's)
        except Exception as exc:  # noqa: BLE001
            self._finished(x)
            raise nixl_error(exc, f"transfer to {x.remote!r}") from None
        return self._finished(x)

    @staticmethod
    def _finished(x: _Xfer) -> str:
        x.finished = True
        x.xfer_us = time.time_ns() // 1000 - x.start_us
        return "DONE"

    def get_xfer_telemetry(self, handle: nixl_xfer_handle) -> nixlXferTelemetry:
        """startTime, postDuration, xferDuration (microseconds), totalBytes,
        descCount; needs capture_telemetry (or NIXL_TELEMETRY_ENABLE)."""
        if not self._telemetry:
            raise nixlNoTelemetryError("telemetry is not enabled (nixl_agent_config(capture_telemetry=True))")
        x = self._xfer(handle)
        if x.batch is None:
            raise nixlNotPostedError("the transfer was not posted")
        return nixlXferTelemetry(x.start_us, x.post_us, x.xfer_us, int(x.cols[2].sum()), int(x.cols.shape[1]))

    def query_xfer_backend(self, handle: nixl_xfer_handle) -> str:
        self._xfer(handle)
        return next(iter(self.backends), "UCX")

    def estimate_xfer_cost(self, req_handle: nixl_xfer_handle) -> Tuple[int, int, str]:
        raise nixlNotSupportedError("tent does not estimate transfer costs")

    def prep_mem_view(self, dlist: Any, *, backends: Optional[List[str]] = None) -> int:
        """NIXL's GPU-device memory views (UCX GPU device API): not served."""
        raise nixlNotSupportedError("memory views need UCX's GPU device API; tent has none "
                                    "(nixl._bindings.HAVE_UCX_GPU_DEVICE_API is False)")

    def release_mem_view(self, mvh: int) -> None:
        raise nixlNotSupportedError("memory views are not served (prep_mem_view)")

    def release_xfer_handle(self, handle: nixl_xfer_handle) -> None:
        handle.release()

    def _release_xfer(self, h: int) -> None:
        with self._lock:
            x = self._xfers.pop(h, None)
        if x is not None and x.batch is not None:
            x.batch.close()  # cancels what still runs and waits, so memory is no longer touched

    # ---- notifications ----

    def _drain(self) -> Dict[str, List[bytes]]:
        out: Dict[str, List[bytes]] = {}
        while True:
            try:
                n = self._engine.recv_notification(timeout=0)
            except tent.Timeout:
                return out
            except Exception as exc:  # noqa: BLE001
                raise nixl_error(exc, "get_new_notifs") from None
            opened = _common.open_envelope(n.message)
            if opened is not None and opened[0] == _common.KIND_USER:
                if self._impersonates(opened[1], n.sender):
                    continue
                out.setdefault(opened[1], []).append(opened[2])
            else:
                out.setdefault(n.sender, []).append(n.message)

    def _impersonates(self, agent: str, sender: str) -> bool:
        """Whether a notification naming agent came from an engine other
        than the one this agent knows agent by (its loaded metadata, or this
        agent itself): the name inside a message is the sender's claim, the
        engine's name is what tent's handshake gave (proved with a secret).
        Such a notification is dropped and counted; one from an agent not
        loaded here cannot be checked and is delivered as NIXL does."""
        with self._lock:
            known = self._engine.name if agent == self.name else (
                r.segment_name if (r := self._remotes.get(agent)) is not None else None)
            if known is None or known == sender:
                return False
            self.notifs_refused += 1
            first = (agent, sender) not in self._refused_senders
            self._refused_senders.add((agent, sender))
        if first:
            logger.warning("dropped a notification naming agent %r from engine %r: that agent is %r here",
                           agent, sender, known)
        return True

    def get_new_notifs(self, backends: Optional[List[str]] = None) -> Dict[str, List[bytes]]:
        """Notifications received since the last call, {agent name: [messages]}."""
        self._check_backends(backends)
        return self._drain()

    def update_notifs(self, backends: Optional[List[str]] = None) -> Dict[str, List[bytes]]:
        """Adds new notifications to ``self.notifs`` and returns it."""
        self._check_backends(backends)
        for k, v in self._drain().items():
            self.notifs.setdefault(k, []).extend(v)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name: str, lookup_tag: bytes,
                               backends: Optional[List[str]] = None, tag_is_prefix: bool = True) -> bool:
        """Whether remote_agent_name's notification with this tag (a prefix,
        or a substring) arrived; removes that one notification."""
        self.update_notifs(backends)
        remote_agent_name = _agent_name(remote_agent_name)
        tag = _common.as_bytes(lookup_tag)
        msgs = self.notifs.get(remote_agent_name, [])
        for m in msgs:
            if (tag_is_prefix and m.startswith(tag)) or (not tag_is_prefix and tag in m):
                msgs.remove(m)
                return True
        return False

    def send_notif(self, remote_agent_name: str, notif_msg: Union[bytes, str], backend: Optional[str] = None) -> None:
        """A notification not bound to a transfer (after the transfers this
        agent already completed to that peer)."""
        if backend is not None:
            self._check_backends([backend])
        remote_agent_name = _agent_name(remote_agent_name)
        seg = self._peer_segment(remote_agent_name)
        try:
            self._engine.notify(seg, _common.envelope(_common.KIND_USER, self.name, _common.as_bytes(notif_msg)))
        except Exception as exc:  # noqa: BLE001
            raise nixl_error(exc, f"send_notif to {remote_agent_name!r}") from None

    @staticmethod
    def _tensor_mem_type(tensor: Any) -> str:
        return "DRAM" if tensor.get_device() == -1 else "VRAM"


def _agent_name(name: Any) -> str:
    """An agent name as given by clients: str, or the bytes add_remote_agent
    returns (NIXL's bindings take either)."""
    if isinstance(name, (bytes, bytearray)):
        return bytes(name).decode("utf-8", "replace")
    if isinstance(name, str):
        return name
    raise nixlInvalidParamError(f"an agent name is str or bytes, not {type(name).__name__}")


def _close_quietly(obj: Any) -> None:
    try:
        obj.close()
    except Exception as exc:  # noqa: BLE001
        logger.warning("releasing %r: %s", obj, exc)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


# ---- the listen thread's side channel -------------------------------------------
#
# One request per connection: a frame (4-byte big-endian length, then a
# tent blob of kind "nixl-<op>"), answered by one frame of kind
# "nixl-reply". Signed like every blob when a secret is configured.

_LEN = struct.Struct(">I")


def _send_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the peer closed the side channel")
        out += chunk
    return bytes(out)


def _recv_frame(sock: socket.socket) -> bytes:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > _MAX_FRAME:
        raise ConnectionError(f"a side-channel frame of {n} bytes")
    return _recv_exact(sock, n)


def _side_call(ip: str, port: int, op: str, body: Dict[str, Any], secret: Optional[bytes]) -> Dict[str, Any]:
    with socket.create_connection((ip, port), timeout=_SIDE_CHANNEL_TIMEOUT_S) as s:
        _send_frame(s, _blob.encode(f"nixl-{op}", body, secret))
        _, reply = _blob.decode(_recv_frame(s), secret, "nixl-reply")
    if not isinstance(reply, dict):
        raise ConnectionError("malformed side-channel reply")
    return reply


def _say_listening(port: int, os_assigned: bool) -> None:
    """NIXL's line for the listen thread's port, on stderr: at INFO when
    the OS chose the port (scripts start a peer with port 0 and read the
    port from this line's last field), else at DEBUG; shown when
    NIXL_LOG_LEVEL allows that level, as NIXL's own logging does."""
    wanted = ("INFO", "DEBUG", "TRACE") if os_assigned else ("DEBUG", "TRACE")
    if os.environ.get("NIXL_LOG_LEVEL", "").strip().upper() not in wanted:
        return
    sys.stderr.write(f"NIXL {'INFO' if os_assigned else 'DEBUG'} MD listener is listening on port {port}\n")
    sys.stderr.flush()


class _Listener:
    """The listen thread: serves send/fetch/invalidate of agent metadata."""

    def __init__(self, agent: nixl_agent, host: str, port: int) -> None:
        self._agent = agent
        fam = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        self._sock = socket.socket(fam, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host.strip("[]"), port))
            self._sock.listen(16)
        except OSError as exc:
            self._sock.close()
            raise nixlBackendError(f"NIXL_ERR_BACKEND: listen thread cannot listen on {host}:{port}: {exc}") from None
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        _say_listening(self.port, os_assigned=port == 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tent-nixl-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(_SIDE_CHANNEL_TIMEOUT_S)
                try:
                    kind, body = _blob.decode(_recv_frame(conn), self._agent._secret)
                    if not kind.startswith("nixl-") or not isinstance(body, dict):
                        raise ValueError(f"unexpected side-channel request {kind!r}")
                    reply = self._agent._serve_side(kind[len("nixl-"):], body)
                except Exception as exc:  # noqa: BLE001 - one bad peer does not stop the thread
                    logger.warning("side channel: %s", exc)
                    reply = {"ok": False, "error": str(exc)}
                try:
                    _send_frame(conn, _blob.encode("nixl-reply", reply, self._agent._secret))
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._sock.close()
