// Package cuda is tent's GPU transport ("cuda", TENT_TRANSPORT_CUDA): it
// moves data to and from GPU memory with the CUDA driver's copy engines,
// between engines of one process, of one host (POSIX file descriptor
// handles passed over a Unix socket) and of one multi-node NVLink fabric
// (FABRIC handles carried in the segment descriptor).
//
// # The driver: the engine's GPU memory
//
// GPU memory is not this package's: it is a kind of the engine's memory
// layer (package memory/cuda, in core.Options.Memory; the C library adds
// it when the process has a CUDA driver), which detects GPU memory,
// allocates it (Engine.Alloc(size, "cuda:N")) and stages it for tcp
// whether or not this transport is installed. Install takes the driver of
// its engine's GPU memory. An engine without GPU memory gets an inert
// transport: it is never Eligible, publishes no endpoint, Stats reports
// "gpus": 0, and the engine leaves it out, with Stats().Unavailable
// saying "no CUDA driver: the engine was created without GPU memory".
//
// The engine's GPU memory checks locations given explicitly against the
// driver (memory/cuda's Verify), because GPU memory declared as host
// memory would make the host-memory transports crash, in every engine
// with GPU memory. RegisterMemory records the engine's GPU allocations (their
// memory/cuda.Allocation: the cuMemCreate mapping and whether it has a
// FABRIC handle) as exportable. Only such engine allocations can be shared
// with other processes: their regions carry an AllocID in the descriptor.
//
// # Moving data
//
// A request is eligible when one side is GPU memory and the peer is in
// this process, or on this host with a cuda endpoint (the remote side must
// then be GPU memory), or on another host with a fabric handle attached to
// the remote region. Copies are cuMemcpyAsync on a pool of non-blocking
// streams per device (unified addressing tells the directions apart: DtoD,
// HtoD, DtoH); a batch waits for an event recorded after its copies (woken
// by a stream host function when the driver has cuLaunchHostFunc, then
// queried for the outcome), then calls Done.
//
//   - Same process: the target engine checks and holds each range
//     (Acquire with remote-read or remote-write access) and the copy uses
//     its addresses directly; nothing is imported.
//   - Same host: each engine with a driver listens on an abstract Unix
//     socket ("@tent-cuda-<pid>-<random>", the "cuda" endpoint), set up as
//     the shm transport's by package transport/internal/lease (admission,
//     framing, descriptor passing, status encoding). Abstract sockets have
//     no file permissions, so the target accepts only peers of its own uid
//     (SO_PEERCRED) or root, then runs the engine's handshake
//     (wire.ServerHandshake, the engine's secret, channel kind KindCUDA;
//     another kind is refused).
//     Imports travel as an fd (SCM_RIGHTS) exported per request with
//     cuMemExportToShareableHandle; the target closes its copy once sent.
//     Only allocations registered for remote read and write are exported
//     (core.Region.HandleShareable): the importer sets its own access
//     (cuMemSetAccess) over the whole allocation, so a handle always grants
//     both. Other GPU allocations are not eligible here; tcp stages them.
//   - Other hosts: a read-write region allocated with a FABRIC handle
//     carries it (a bearer capability: whoever reads the descriptor can
//     import it) as a descriptor attachment (transport "cuda": u8 version 1, u64
//     allocation size, 64-byte CUmemFabricHandle); the initiator imports
//     it with cuMemImportFromShareableHandle(FABRIC) and asks for leases
//     over a KindCUDA connection to the engine's own TCP listener.
//
// # The lease protocol: the target stays in control
//
// An imported mapping lets the initiator's GPU write anywhere in the
// allocation, for as long as the mapping lives, whatever the target has
// since unregistered. So before a batch touches any import, the initiator
// asks the target for a lease on exactly the ranges of the batch. The
// target checks every range with Engine.Acquire (registered, inside one
// region, permission for the access) and holds the granted ones, so that
// unregistering them waits (and, past UnregisterTimeout, fails with
// ErrBusy) instead of pulling memory from under a copy. It answers one
// status per range, plus, for a granted range, the id, address and length
// of the allocation that now holds it and the device's uuid. A refused
// range fails its request with the target's code (NotRegistered,
// OutOfRange, PermissionDenied, ...). The initiator uses the allocation id
// of the lease, not the one of its possibly stale descriptor, to choose
// the import. After the copies are done it releases the lease; the target
// also releases it when the session ends and at the lease's deadline plus
// a grace period (5 s), so a vanished initiator cannot pin memory.
//
// Session frames (wire framing; requests carry an id the reply echoes):
//
//	1 hello     S->C  u64 incarnation, u32 pid (first frame)
//	2 import    C->S  u64 id, u64 alloc id
//	3 imported  S->C  u64 id, u32 nfds (0/1), status, u64 base, u64 size; fd by SCM_RIGHTS
//	4 lease     C->S  the lease request of package lease (u64 id, u64 ttl ns,
//	                  count n, n × (u8 op, u64 addr, u64 len))
//	5 leased    S->C  u64 id, u64 lease id (0: none granted), count n,
//	                  n × (status, u64 alloc id, u64 addr, u64 len, u8 cuda, str uuid)
//	6 release   C->S  u64 lease id
//	7 revoke    S->C  count n, n × u64 alloc id (imported allocations now unregistered)
//
// A status is wire's (an i32 code and a str message). A received control
// message other than SCM_RIGHTS, or truncated, ends the session and closes
// the descriptors that came with it. Leases hold at most 16384
// ranges; larger batches take several.
//
// # The import cache and the generation rule
//
// Imports are cached per key (target incarnation, allocation id, local
// device), never per address: a target that restarts, or frees and
// allocates again, may reuse an address, but never an (incarnation,
// allocation id) pair. An entry records exactly what it holds in a
// cuda.Mapping (handle and whether held, fd, reservation address and
// size, mapped size, device). It is used only while its generation, the
// transport's generation at import, is the transport's current one (bumped
// by Install and Uninstall) and it has not been killed. Entries are
// killed, and released as soon as no batch holds a reference to them,
// when:
//
//   - the transport is uninstalled (all of them, after the batches end);
//   - the peer's Epoch() changes and its descriptor no longer lists the
//     allocation, or lists another incarnation (all of the old one);
//   - the target revokes an allocation (it was unregistered or freed: the
//     importer's mapping is what keeps its memory alive, so it goes at
//     once, without waiting for a next transfer);
//   - the session to the target dies (it can no longer grant leases, and
//     a target that exited is kept alive only by our mappings).
//
// Each batch takes a reference on the entries it copies with and drops it
// after its copies completed, so an entry is never unmapped under a copy
// and a later batch re-imports rather than touch an unmapped address.
// There are no thread-local caches: every lookup goes through the one
// cache and its checks.
//
// # Release order and failures
//
// Everything is released in the order unmap, release handle, free
// reservation, close fd (cuda.Mapping.Release). An import closes the fd
// it received as soon as the handle is imported (the handle keeps the
// allocation alive), so cached entries hold no fd and a process with many
// imports does not run out of descriptors. A failure at any step of an
// import (cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap,
// cuMemSetAccess, ...) undoes the steps already done and closes the fd;
// the request fails with the driver's error (its code and the call's
// name) and nothing is cached. An export failure at the target fails the
// request with the target's code. A release that fails stays recorded
// (Mapping.Release retries only the failed steps) and is retried by
// Uninstall. No failure aborts the process; the goroutines recover from
// panics and fail their requests with status.Internal.
//
// # Uninstall and engine destroy
//
// Uninstall marks the transport closed and bumps the generation; closes
// the connections being dialed and aborts the sessions (their waiting
// calls fail; the connections, and the leases the targets hold for copies
// in flight, stay), which wakes batches waiting for a lease or an import;
// batches that have not queued their copies fail them with
// core.ErrUninstalled (status.Closed), batches whose copies are queued
// wait for them and release their leases. Then it waits for every batch,
// closes the sessions, syncs and destroys the streams and events, releases
// every import, and closes the target side: no new lease is granted, the
// initiators get up to 5 s to release the leases they hold (their copies
// may still be running), then the listener and the served sessions close
// (releasing what is left), and it waits for its goroutines. Afterwards Stats reports zero mappings, streams, events,
// sessions, connections, leases and requests in flight. Install may be
// called again; it starts afresh.
//
// # Not supported (yet)
//
//   - Remote GPU memory that the peer registered rather than allocated
//     with tent_alloc (cudaMalloc, cuMemAlloc, PyTorch's caching
//     allocator): it cannot be mapped by another process with VMM handles,
//     so this transport is not eligible for it; the tcp transport moves it
//     through host memory (status flag TENT_STATUS_STAGED), and without
//     tcp the request fails with status.Unsupported. (Legacy
//     cuIpcGetMemHandle could share it; not implemented.)
//   - Local GPU memory with host memory of another process: likewise left
//     to tcp's staging. Local host memory with remote GPU memory works.
//   - A copy cannot be aborted once queued: a batch waits for its copies
//     even past its deadline, and a lease covers copies queued before the
//     deadline plus 5 s.
//   - Imports for host-memory requests are mapped on the GPU owning the
//     memory (matched by uuid), for GPU requests on the local GPU, which
//     then needs peer access to the owner.
//   - Host memory is not page-locked by the transport (cuMemHostRegister);
//     pageable copies are staged by the driver.
package cuda
