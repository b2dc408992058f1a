// Package tcp is tent's transport across hosts: READ and WRITE requests
// travel over TCP connections to the peer engine's listener, and the
// peer's engine (the target) checks every one against its registrations
// before it touches a byte.
//
// # Connections
//
// Data connections go to the same listener as the control link. The
// initiator dials with Engine.DialContext, asking for channel kind
// KindData (declared in the transport's Spec); the engine's authenticated
// handshake (see package wire: HMAC-SHA256 challenge-response over the shared secret, protocol
// version negotiation, the kind bound into the proofs) runs first, so a
// peer without the secret never gets to send a request. The protocol
// below is version 1 of the data channel; it is tied to the handshake's
// protocol version, and the hello repeats it so that a mismatch is
// reported as VersionMismatch rather than as garbage.
//
// Each peer incarnation gets up to Options.Streams connections
// ("streams", default 4), dialed on first use. A peer is known by its tcp
// endpoint and by the incarnation in the descriptor the requests were
// routed with; a restarted peer has a new incarnation, so it gets new
// connections, and the hello lets the initiator notice when the address
// now answers with another incarnation.
//
// # Protocol (version 1)
//
// All integers are little-endian. Reserved fields and flags must be zero;
// anything else, an unknown op or status code, a length outside its bounds
// or a reply that does not answer the oldest outstanding request is a
// protocol error, and the side that sees it closes the connection.
//
// After the handshake the target sends one hello:
//
//	0   4   magic "TTCP"
//	4   2   u16 data protocol version (1)
//	6   2   reserved
//	8   8   u64 incarnation of the target engine
//
// Then the initiator sends requests, each a 24-byte header, followed for a
// WRITE by its payload:
//
//	0   1   u8 op: 1 WRITE (initiator -> target), 2 READ (target -> initiator)
//	1   1   u8 flags
//	2   2   reserved
//	4   4   u32 length n, 1 <= n <= MaxChunk (16 MiB)
//	8   8   u64 id, chosen by the initiator (increasing per connection)
//	16  8   u64 target address; address + n must not overflow
//	24  n   WRITE only: the payload
//
// The target answers every request, in the order received, with a 24-byte
// header, an optional message and, for a successful READ, the payload:
//
//	0   1   u8 op, echoed
//	1   1   u8 flags: bit 0 (success only) the target copied the data
//	        through host memory (its region is GPU memory); others zero
//	2   2   u16 message length m, 0 on success, <= 1024
//	4   4   i32 status: 0, or a negative tent status code (NotRegistered,
//	        OutOfRange, PermissionDenied, ...)
//	8   8   u64 id, echoed
//	16  4   u32 payload length: n for a successful READ, else 0
//	20  4   reserved
//	24  m   the error message (UTF-8, truncated to 1024 bytes)
//	24+m    the payload
//
// The initiator splits requests longer than 1 MiB into chunks of at most
// 1 MiB, each a request on the wire, and spreads them over the streams; a
// request succeeds when all its chunks do and fails with the first error.
//
// # What is enforced where
//
// The initiator's engine checks requests against the peer's cached
// descriptor, to fail early. That is a courtesy: the target calls
// Engine.Acquire(address, n, AccessRemoteWrite or AccessRemoteRead) for
// every request, which checks that the range lies within one registered
// region that grants the permission, and pins the region (unregistering
// waits) while its memory is read or written. A host region stays pinned
// until the replies collected with it are written (at most 512 requests
// or 2 MiB of replies, and never while the handler waits for the next
// request), and the next requests are checked against it first: a run of
// requests into one region takes one Acquire, not one each; unregistering
// it waits for that write. A peer with a stale or
// forged descriptor gets NotRegistered, OutOfRange or PermissionDenied in
// the reply and nothing is touched. A refused WRITE's payload is still
// read, into the connection's receive buffer, and dropped, so the stream
// stays in step.
//
// # Copies
//
// Payloads go from registered memory to the socket with writev (headers
// and payloads of many requests in one call, net.Buffers), and from the
// socket into registered memory with readv. Each side reads through a
// 64 KiB receive buffer and adapts to what the headers announce:
//
//   - small payloads (under 16 KiB) come through the buffer, many requests
//     per read, and are copied once from it: a system call per request
//     would cost more than the copy;
//   - a large payload is read with readv straight into its destination,
//     with only the next header behind it landing in the buffer; while
//     payloads stay large, reads into the buffer stop at the next header,
//     so in steady state each large request costs one readv and no copy.
//
// No payload is staged on the Go heap; a refused WRITE's payload is read
// into the receive buffer and dropped. The target's handler runs under
// one fault guard for its connection (memory/host.Guard), so its copies
// out of the buffer are plain copies: a fault on registered memory that
// its owner unmapped without unregistering ends the connection, never the
// process, and is logged at Error with its address (the guard covers the
// handler's own code as well, where a fault would be a bug, so it is
// never quiet). On the initiator each copy is guarded on its own.
//
// # GPU memory
//
// GPU memory cannot be handed to a socket, so it goes through host memory
// (mmap'd buffers, not the Go heap), copied by the memory kind of that
// side's engine (memory.Kind CopyOut and CopyIn, the CUDA driver's copies
// for memory/cuda), so an engine needs GPU memory in its memory layer, not
// the cuda transport. This serves what the cuda transport cannot:
// cudaMalloc memory of another process, and GPU memory with host memory
// of another process or host. On the initiator, requests on local GPU
// memory go to a staging goroutine per Submit call, which moves each
// request in pieces of 4 MiB through its buffer (WRITE: copy from the
// GPU, then send the piece as a request of its own; READ: receive, then
// copy to the GPU), so staging memory is bounded whatever the request
// size. On the target, a request on a GPU region is read into (or copied
// out to) the connection's staging buffer, and a READ reply leaves at
// once so the buffer is free for the next request. Either way the
// request's status carries core.FlagStaged (TENT_STATUS_STAGED); a failed
// GPU copy fails that request with the driver's reason.
//
// # Threading
//
// Initiator: Submit splits and queues chunks and returns. Each connection
// has a writer goroutine (it dials, then sends whatever is queued, up to
// 4 MiB or 512 requests per writev, without waiting for replies) and a
// reader goroutine (it takes replies in order and completes requests).
// When a stream is up and idle (nothing queued or awaiting a reply, no
// write in progress), Submit writes what it queued there itself instead
// of waking the writer, if that is at most 64 KiB on the wire (headers,
// and WRITE payloads; a READ is its header), and on one stream per Submit
// call up to a stream's whole share of the batch (1 MiB of payload and its
// headers: 128 WRITEs of 4 KiB are one writev by the submitter, no
// hand-off); the other streams' writers are woken before it writes, so
// they go in parallel. It never waits for the socket: what the send
// buffer does not take at once is left to the writer. Whoever writes
// holds the connection's writing flag, so the requests go out in id order
// either way.
//
// The replies of a connection are read by whoever holds its read side
// (readside.go): its reader goroutine, or a caller blocked in Batch.Wait,
// which the engine lends to the transport (core.Helper). A reply the reader goroutine reads costs two wake-ups
// (the netpoller wakes the reader, the reader wakes the caller); read by
// the caller itself, one. The caller takes the read side when it is free,
// or from the reader goroutine at a reply boundary (it sets the socket's
// read deadline in the past; the reader lets go when its read times out,
// and what had arrived of the next header stays in the shared receive
// buffer); it reads until its batch is done or nothing more is due, and
// completes the replies of other batches on the way. A caller that finds
// the reader goroutine inside a reply, or another caller reading, waits as
// before. A caller whose Wait has a timeout (the Python layer waits in
// 200 ms slices) reads with a read deadline no later than the timeout and
// lets go at the first reply boundary after it (what came of the next
// header stays in the buffer, and the reader goroutine reads on); a reply
// it is inside of when the timeout passes it reads to the end, so the
// stream is never cut and the Wait overruns by that one reply at most.
// Such a caller first blocks its thread in ppoll(2) on the socket for up
// to 250 us (then waits in the netpoller): a small reply then reaches a C
// thread calling in with one kernel wake-up and no Go scheduler hand-off.
// It helps only while at most 512 KiB is due on the connection (a large
// batch streams through the reader goroutine as before).
// Requests submitted with core.TransferOptions.Waiting (their
// caller waits at once, as tent_transfer_sync does) do not wake the reader
// goroutine of the stream their batch's first request went to (the one
// the caller reads; the reader goroutines of the batch's other streams
// are woken for theirs); when a caller lets go with nothing due, the reader
// goroutine takes the idle connection back after a millisecond, so a
// connection that breaks while idle is still noticed. Cancel kicks a
// caller blocked reading (its batch may be over while its reply is not
// in). Stats counts replies_by_reader, replies_by_caller and
// read_side_kicks.
//
// Target: the engine's listener runs one handler per accepted connection;
// it serves requests in order and writes the collected replies (one
// writev, READ payloads straight from registered memory, which stays
// acquired until then) when a non-blocking read finds no further request,
// or 2 MiB, 512 payloads or 512 replies have piled up. Parallelism comes from the
// streams.
//
// # Deadlines, faults, cancel
//
// Every request carries its batch's deadline. A connection's socket
// deadline is the earliest deadline of the requests it holds (queued,
// being written, or awaiting replies); when it passes and one of them is
// overdue, the connection has stalled: it is closed, its overdue requests
// fail with Timeout and the others with TransportError. (A deadline left
// over from completed requests is simply moved.) A connection that breaks
// fails its requests with TransportError, marks the peer's descriptor
// stale (it may have restarted), and is dialed again by the next request.
// A target closes a connection whose peer stalls inside a request or stops
// reading replies for Options.DefaultTimeout.
//
// A request is completed exactly once, by whichever goroutine ends its
// last use: Cancel, a failure or the last reply makes it dead or done,
// but while a writer or reader is inside its local memory, Done waits for
// it to leave. The payload of a READ reply for a dead request goes to
// scratch, a dead WRITE not yet sent is not sent.
//
// The states and chunks of one Submit call are reused by a later call
// once every request of it is completely over: completed, no chunk left
// on the wire, no goroutine inside its memory, and no Cancel or Help
// holding a state it found (request.go, submission). So a batch's
// header fields are copied into the write's buffer when its group is
// taken, and the end of a write touches only the WRITE states it
// entered.
//
// # Lifetimes
//
// A connection that has carried nothing for two minutes (no chunk queued,
// sent or being answered) is closed by a reaper goroutine, which runs
// only while the transport has connections; the next request to that
// peer dials again. Marking a connection idle-dead and refusing new chunks
// happen under its lock, so a chunk never lands on a connection closed
// for idleness. Stats counts them as idle_closed.
//
// Uninstall stops the engine from passing data connections to the
// transport, cancels dials, closes every connection (dialed and accepted),
// fails the requests in flight with core.ErrUninstalled and waits for
// every goroutine and handler. Stats reports connections, goroutines,
// requests in flight (all zero afterwards), and bytes and failures so far.
//
// Addresses: the endpoint published is the engine's listen address. An
// engine that listens on a wildcard address (0.0.0.0) must be given a
// routable ListenAddr for peers on other hosts to reach it.
package tcp
