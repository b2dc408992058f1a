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
// Frames are at most maxFrame bytes; anything malformed (unknown type or
// op, bad counts, trailing bytes, a duplicate lease id, fewer descriptors
// than announced, a control message other than SCM_RIGHTS, truncated
// control data) closes the connection, and the descriptors received with
// it are closed.
//
// # Lease lifecycle
//
// Each Submit call becomes one job; the job sends one LEASE per run of at
// most 4096 requests to one peer (normally exactly one per batch). The
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
// first.
//
// Every other granted entry, and any entry whose allocation is not mapped
// here, goes through process_vm_readv/process_vm_writev: iovecs of the
// lease batched per direction, IOV_MAX (1024) and 16 MiB per call,
// partial transfers resumed where the kernel stopped. A call of 512 KiB
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
// period bounds that window for a live one. Peer pids come from the
// kernel (SO_PEERCRED), not from descriptors, so a lying descriptor cannot
// aim process_vm at a third process.
package shm
