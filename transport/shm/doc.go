// Package shm is the transport between engines of one host in different
// processes: bytes move at memcpy speed, either through the target's
// tent_alloc memory mapped into the initiator (memfd, passed once with
// SCM_RIGHTS), or with process_vm_readv/process_vm_writev for any other
// registered memory. The target stays in control: nothing is copied
// before it has checked the request against its registrations, and the
// regions stay pinned while the copy runs. Linux only.
//
// # Endpoints and eligibility
//
// Every engine with shm installed listens on a Unix stream socket in the
// abstract namespace, "@tent-shm-<pid>-<16 hex digits>", published in its
// descriptor as the endpoint {"shm", "@tent-shm-..."}; endpoint, admission,
// framing and descriptor passing are package transport/internal/lease's,
// shared with the cuda transport. Only peers of the target's uid, or
// root, are admitted (SO_PEERCRED at accept): another user's connection
// is closed before its handshake. A request is eligible
// when the peer's descriptor has the MachineID of this host and an shm
// endpoint, and both regions are host memory. Connections run the tent
// handshake (wire.ClientHandshake / wire.ServerHandshake, channel kind 3)
// with the engine's secret, exactly as TCP connections do; the initiator
// also checks that the server answers with the segment's name. The pid
// process_vm targets comes from SO_PEERCRED on that connection: the
// kernel's answer in this process's pid namespace, not the descriptor's.
// The listener runs the engine's accept loop (internal/acceptloop): it
// retries after transient accept errors and bounds the connections still
// in their handshake (Options.MaxUnauthenticated, HandshakeTimeout).
//
// # Frames
//
// After the handshake both sides exchange wire frames (u8 type, 3 zero
// bytes, u32 payload length, payload; little-endian throughout):
//
//	1 LEASE   initiator -> target: the lease request of package lease
//	  u64 lease id      unique per connection, chosen by the initiator
//	  u64 ttl           nanoseconds left until the requests' deadline
//	  u32 count         1 <= count <= MaxLeaseEntries (4096), then per entry:
//	    u8  op          0 read (target -> initiator), 1 write; others rejected
//	    u64 addr        the target's address
//	    u64 len
//
//	2 GRANT   target -> initiator, answering one LEASE
//	  u64 lease id
//	  u64 generation    the target's registration generation after its checks
//	  u64 ttl           nanoseconds granted (the asked ttl, capped by the
//	                    target's DefaultTimeout)
//	  u32 nfds          <= 32: memfds attached with SCM_RIGHTS, in this order:
//	    u64 alloc id    never 0
//	    u64 base        the allocation's address in the target
//	    u64 size        bytes to map, 0 < size <= 2^46
//	    u8  flags       bit 0: the descriptor is writable; others rejected
//	  u32 count         equal to the LEASE's count, then per entry (the
//	                    answer entry of transport/internal/lease):
//	    i32 code        0 granted, else the refusal's status code
//	    code == 0: u64 alloc id   copy through this allocation's mapping;
//	                              0 means use process_vm
//	    code != 0: u32 n, n bytes  why (n <= 200)
//
//	3 RELEASE initiator -> target, no answer
//	  u64 lease id
//
//	4 REVOKE  target -> initiator push, no answer
//	  u32 count <= 4096, count x u64 alloc id   unmap these allocations
//
//	5 LEASE_CACHED  initiator -> target: the payload of LEASE; the
//	                initiator accepts standing grants with the answer
//
//	6 GRANT_CACHED  target -> initiator, answering one LEASE_CACHED: the
//	                payload of GRANT with the standing grants between the
//	                descriptor list and the entries:
//	  ... u32 nfds and the descriptors, as GRANT
//	  u32 nstanding     <= 4096, then per standing grant:
//	    u64 grant id    unique per connection, never 0
//	    u64 base        the target region's address
//	    u64 len         the region's length, > 0, base+len does not wrap
//	    u8  perm        bit 0 remote read, bit 1 remote write; not 0,
//	                    other bits rejected
//	    u64 alloc id    the allocation copies under it go through (a
//	                    descriptor this connection received), 0: process_vm
//	  u32 count and the entries, as GRANT
//
//	7 REVOKE_GRANT  target -> initiator, answered by REVOKE_ACK
//	  u64 seq           unique per connection
//	  u32 count         1 <= count <= 4096, count x u64 grant id
//
//	8 REVOKE_ACK    initiator -> target
//	  u64 seq           of the REVOKE_GRANT whose grants are gone: no copy
//	                    runs or will start under them
//
// Types 1 to 4 keep their layout, and a target answers a LEASE with a
// GRANT as before, so an initiator that sends only those is served as it
// always was. An initiator of this version sends LEASE_CACHED, which a
// target of an earlier version does not know (it closes the connection):
// both ends of a host run the same library.
//
// Frames are at most maxFrame bytes; anything malformed (unknown type or
// op, bad counts, trailing bytes, a duplicate lease id, fewer descriptors
// than announced, a control message other than SCM_RIGHTS, truncated
// control data) closes the connection, and the descriptors received with
// it are closed.
//
// # Lease lifecycle
//
// Each Submit call becomes one job; the job sends one LEASE_CACHED per run
// of at most 4096 requests to one peer (normally exactly one per batch),
// unless the run is covered by standing grants (below). The
// target checks every entry with Engine.Acquire(addr, len,
// AccessRemoteRead/Write) — registered, inside one region, permitted, not
// being unregistered — which also pins the region, so the target's
// unregister waits for the copy. An entry that lies inside a region the
// same lease already pinned, with the permission it needs, shares that
// pin (the region cannot go before the lease does), so a batch into one
// buffer costs one Acquire. The target answers each entry with OK or the
// refusal's code (NotRegistered, OutOfRange, PermissionDenied,
// InvalidArgument; Busy when the connection already holds 1024 leases;
// Closed while the target's transport shuts down). Refused requests
// complete with that code, which the engine does not retry. The initiator
// copies only granted entries, then sends RELEASE without waiting, then
// completes the requests.
//
// # Standing grants
//
// A LEASE_CACHED is checked and pinned exactly as a LEASE. With its
// answer the target may make standing grants: one per (connection,
// region, permission) for the regions it granted entries in, covering the
// region's exact range [base, base+len) and the permissions the lease
// used there (read, write or both) — never more than the region allows
// remotely (Engine.Acquire checked every entry) nor more than was asked.
// A region asked to read and later to write gets a read grant and then a
// write grant. The target's check thus happens once per grant instead of
// once per batch. A connection holds at most 4096 standing grants; past
// that, and while the transport shuts down, the target answers with the
// lease alone. The target records a grant, and writes the frame that
// announces it, under the connection's write lock and while the lease's
// pin holds the region: the region cannot reach UnregisterMemory before
// the grant is recorded, and its REVOKE_GRANT cannot precede the
// announcement on the stream.
//
// The initiator caches the grants of each connection in a slice sorted
// by base, installed by the reader before it reads the next frame. A
// batch (one lease run) whose every request lies inside a live grant with
// the permission it needs takes a reference on those grants and copies at
// once — through the mapping the grant names, or process_vm, as under a
// lease — and sends nothing; the lookup is a binary search under the
// connection's grant lock and allocates nothing. Any other batch asks with
// a LEASE_CACHED as before (a miss costs the round trip, never
// correctness). A hit is copied in Submit itself, on the caller's
// goroutine, when the batch is one lease run on a live connection and is
// at most 256 KiB or its caller waits for it right after
// (Request.CallerWaits): the waiter then finds it complete and never
// parks. Other batches, and batches during Uninstall, go to a job
// goroutine. A job not yet claimed by its goroutine is claimed instead by
// the caller that waits for the batch (core.Helper, Batch.Wait and
// tent_batch_wait, timed or not): the claim is exactly once (a
// generation-tagged compare-and-swap, so a claim that comes late never
// takes a later use of the reused job), and whoever wins runs the job,
// the other does nothing. The waiter copies each lease run that needs no
// round trip exactly as the job would (same grant references, enterCopy,
// fault guard, cancel and revoke checks, counters), in parts it can start
// before its wait ends (counting 1 GB/s, so a timed wait overruns by at
// most the part in progress); a miss, or what it may not start in time,
// it hands to a new job goroutine. The waiting thread then finds the
// batch complete instead of sleeping until a job goroutine wakes it. A
// run that would move 4 chunks (64 MiB) or more through process_vm is
// handed over too (longPVM): each of its calls is split over two threads
// and joined, and a waiter's thread may be a locked C thread, which a
// join must wake on its own (the copy of 128 x 4 MiB moved 5-10% less on
// the waiter than on a job goroutine, while smaller runs gain from the
// waiter). Stats: pvm_handed_off.
// Once the waiters of 8 batches in a row have claimed them, Submit
// starts no goroutine for a job that holds its batch's first request (the
// one the waiter's claim names): the job is deferred, and only if no
// waiter claims it within 100 µs (about a millisecond when every thread
// is idle: the Go runtime's poller sleeps in whole milliseconds) does a
// goroutine run it; then later jobs start theirs at once again until 8
// more are claimed, so a caller that polls pays that once, not per
// batch. A cancel and Uninstall start a deferred job at once. This saves
// the goroutine's start, whose wake-up of an idle thread (a futex call
// and an inter-processor interrupt) was paid on every batch even when the
// waiter won the claim. Stats: jobs_deferred, and defer_expired for the
// deferred jobs no waiter claimed in time.
// Stats: grant_hits and grant_misses count lease runs (a run a waiter
// copies in parts counts one hit per part), copies_inline the hits copied
// in Submit, copies_helped those copied by a waiter, grants_cached the grants live here, grants the
// grants peers hold on this engine's memory (both back to zero with the
// connections).
//
// Revocation is synchronous. Engine.UnregisterBatch (and Free, which
// unregisters first) refuses new Acquires on the regions, waits until no
// pin holds them, and then calls UnregisterMemory before it returns.
// There the target takes the regions' grants out of every connection,
// sends REVOKE_GRANT on each connection that held one, and waits for each
// REVOKE_ACK or for that connection's death (a killed initiator: the
// kernel closes its socket), at most UnregisterTimeout (on top of the wait
// for pins). The initiator's reader, on REVOKE_GRANT, removes the grants
// from its cache (no lookup finds them), marks them dead (no copy step
// starts under them: checked before each request, each 16 MiB step and
// each process_vm call, such a copy fails with NotRegistered), waits for
// the copies holding a reference on them to end (a reference count and a
// condition variable, no sleeps), and only then sends REVOKE_ACK. So when
// tent_unregister or tent_free returns, no copy under a revoked grant runs
// or can start. A connection that has not acknowledged by the timeout
// (a stuck or dishonest initiator) is closed, which ends its leases and
// grants on the target; the unregister completes without hanging, and
// that initiator's next batch reconnects and is checked afresh. The
// descriptor REVOKE of freed allocations follows the grant revokes.
// Uninstall revokes every grant the same way before it waits for leases.
// Stats: revokes_sent and revokes_acked count REVOKE_GRANT frames and
// their acknowledgements, revoke_timeouts the connections closed for want
// of one, grants_revoked the grants an initiator gave back.
//
// The target releases a lease on RELEASE, when its connection closes (a
// dead or killed initiator: the kernel closes the socket), and when its
// deadline — ttl plus leaseGrace (2 s) from the grant — passes (a stuck
// initiator). The initiator starts no copy step after the lease's ttl or
// the requests' deadline, whichever is first, and a step is at most chunk
// (16 MiB) bytes, so the grace covers the step in progress. A grant that
// arrives after its waiter gave up (deadline, cancel, uninstall) is
// released by the connection's reader at once.
//
// # Copy paths
//
// A granted entry in memory the target allocated with tent_alloc (a
// memfd) names the allocation when the allocation may be shared
// (core.Region.HandleShareable: the registration covers the whole
// allocation and permits remote read and write) and the peer runs as the
// target's uid or as root (SO_PEERCRED on the accepted connection, which
// the listener already required; checked again before a descriptor goes
// out). The
// target attaches the allocation's descriptor to the grant the first time
// it grants that allocation on the connection, and never for memory it did
// not grant. A memfd is not a read-only capability whatever its open mode:
// the receiver can reopen /proc/self/fd/N read-write and map it writable.
// So memory without remote write (and write-only memory: a mapping cannot
// be write-only) never leaves as a descriptor; it goes through process_vm.
// The memfds are sealed against shrinking and growing (F_SEAL_SHRINK,
// F_SEAL_GROW, F_SEAL_SEAL), so a receiver cannot ftruncate the target's
// memory into SIGBUS. Stats counts descriptors sent (fds_sent) and
// received (fds_received). The initiator checks the descriptor's size
// with fstat, maps it MAP_SHARED once, closes the descriptor at once, and
// copies with a plain copy() in steps of at most 16 MiB, checking that the
// range lies inside the mapping (and that a write has a writable one)
// first. Requests that continue each other on both sides (the same op,
// the same allocation) share one step of at most 512 KiB (mergeMax, under
// memmove's threshold for non-temporal stores): each passes its own
// checks (the target's grant, uninstall, connection, cancel, standing
// grant, the mapping not dropped) before the step, so a
// cancel or revoke stops the requests after the step in progress, as
// within one large request; a step that faults is copied again request by
// request, so the fault fails only the request whose memory faulted.
//
// Every other granted entry, and any entry whose allocation is not mapped
// here, goes through process_vm_readv/process_vm_writev: iovecs of the
// lease batched per direction, IOV_MAX (1024) and 16 MiB per call,
// partial transfers resumed where the kernel stopped. Consecutive
// entries that are contiguous on both sides share one iovec (the kernel
// pins pages per iovec: 128 adjacent 4 KiB requests are one pin of 128
// pages, not 128 pins of one); when a call fails, only the requests whose
// bytes the kernel had not copied fail. A call of 2 MiB
// or more is cut in two halves of equal bytes that run on two threads
// (when GOMAXPROCS allows): the kernel copies on the calling CPU at about
// half of what the memory bus takes, and the other side of a same-host
// transfer is idle. A half that fails fails only its own requests. A refusal (EPERM,
// EACCES, ENOSYS, ESRCH) completes the request with TransportError, so
// the engine retries it once on the next transport (tcp) and the status
// carries the RETRIED flag; after EPERM/EACCES/ENOSYS the peer's
// incarnation is not offered process_vm work again (Eligible says no for
// its non-allocated memory), so later batches go to the next transport
// directly. The same holds for a peer whose pid is not visible here
// (another pid namespace). A peer with this host's MachineID in another
// network namespace cannot be reached (abstract sockets are per network
// namespace): each batch pays a refused dial and a retry on the next
// transport; such hosts should set distinct TENT_MACHINE_IDs.
//
// Copies run with debug.SetPanicOnFault: a fault (a target that shrank its
// memfd, a caller that unmapped registered memory) fails the request with
// TransportError instead of killing the process.
//
// # The mapping cache and its invalidation
//
// Mappings belong to the connection that received their descriptors; the
// connection belongs to a client for one incarnation of one peer. So the
// cache is keyed by (peer incarnation, allocation id), and allocation ids
// are never reused within an incarnation. The rule: a mapping is used only
// when the target's grant for this very copy names its allocation id, and
// only while it is live in the cache, with a reference held for the
// duration of the copy. It is dropped
//
//   - when the target sends REVOKE (it does so from UnregisterMemory, once
//     the allocation's regions are idle, on every connection that received
//     the descriptor);
//   - when the peer's Epoch() has changed and its descriptor, at least as
//     new as the mapping's grant, no longer lists the allocation (checked
//     before each lease);
//   - when the connection dies or the peer's incarnation changes (the old
//     client is closed);
//   - on Uninstall.
//
// A dropped mapping is unmapped when its last copy ends (munmap never
// races a copy), and nothing can reach it afterwards: there is no
// address-keyed cache anywhere, so a new allocation at the same address
// is a different id and a different mapping, and after a restart the peer
// is a different client. This is the bug class of Mooncake's MNNVL
// transport, whose thread-local relocation cache kept addresses of
// unmapped memory.
//
// # Cancel, deadlines, teardown
//
// Every wait has a deadline from the requests: the dial and handshake, the
// lease write, the wait for the grant. A dead peer (kill -9) closes the
// socket: waiters fail with TransportError at once, copies through
// process_vm fail with ESRCH (TransportError), and the peer's cached
// descriptor is invalidated so the next batch resolves it again and
// reconnects (a restarted peer has a new incarnation, hence fresh state).
// Cancel marks requests; those not yet copied complete with ErrCanceled,
// and a job whose requests are all canceled stops waiting for its lease.
//
// Closing a connection releases its leases on the target, so nothing
// closes a connection under a copy that still runs: a job checks between
// copy steps that its connection is alive (and stops if not: the target
// has let go); the connection of a peer that restarted is retired and
// closes when its last job has released its lease; and Uninstall goes in
// three steps. First, as initiator, it makes jobs stop before their next
// copy step (what has not been copied completes with
// core.ErrUninstalled), wakes every waiter, cuts dials and handshakes,
// and waits for the copies in progress to release their leases. Then, as
// target, it closes the listener, refuses new leases (Closed) and waits
// for peers to release the leases they hold, at most UnregisterTimeout.
// Last it closes every connection (releasing what is left), unmaps every
// mapping, closes every received descriptor and waits for every
// goroutine. Stats reports
// connections, leases (held on this engine's memory), mappings, fds (held,
// received and not yet closed), goroutines and jobs, which all return to
// zero, plus byte and event counters.
//
// # Security boundary
//
// The transport authenticates peers with the engine secret, and the
// target's checks bound what an honest initiator does, whatever its cache
// says. Against a malicious process the boundary is the kernel's:
// process_vm needs ptrace permission over the target (same user, and
// Yama's ptrace_scope or a non-dumpable target can forbid even that),
// and a process with that permission can already read and write all of
// the target's memory without tent; tent hands it nothing. Descriptor
// sharing is narrower: only read-write allocations the target granted in a
// lease, to peers of its uid (no other user gets past accept) — but once
// sent, a mapping outlives the lease and the registration until the
// initiator drops it, and a dishonest
// initiator may keep it; revocation (REVOKE) relies on the initiator's
// cooperation, and the memory of a freed allocation is only returned to
// the system when every mapping is gone (no other data ever lands in it).
// A lease taken back at its deadline cannot stop a
// process_vm call already running in a stopped initiator; the grace
// period bounds that window for a live one. Standing grants revoke the
// same way, cooperatively: the REVOKE_ACK is the initiator's word that no
// copy runs under them, and a process with ptrace permission could go on
// with process_vm after it, as it could without tent. Against an honest
// but stuck initiator the target closes the connection at
// UnregisterTimeout, which stops its next copy step (each checks its
// connection), not a step in progress. Peer pids come from the
// kernel (SO_PEERCRED), not from descriptors, so a lying descriptor cannot
// aim process_vm at a third process.
package shm
