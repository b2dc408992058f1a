// Package lease is what the same-host transports (shm, cuda) share: the
// endpoint they listen on, who may connect to it, the framing of their
// sessions, how file descriptors travel, and how a status is encoded.
// Each transport defines only its own frame types on top.
//
// # Endpoint and admission
//
// A transport listens on a Unix stream socket in the abstract namespace,
// "@tent-<transport>-<pid>-<16 hex digits>" (Listen), published in the
// engine's descriptor as the endpoint {"<transport>", address}. Abstract
// sockets have no file permissions, so admission is the kernel's word on
// who connected (SO_PEERCRED, taken at accept by internal/acceptloop with
// Config.SameUser): only a peer running as this process's uid, or as
// root, gets past accept; any other connection is closed before a byte is
// read and counted as peer_rejected in the listener's stats. The reason
// is what the endpoints hand out: memory mappings (memfds, CUDA handles)
// that outlive the lease they came with, and process_vm work on the
// target's behalf. The accept loop also bounds connections still in their
// handshake (Options.MaxUnauthenticated, HandshakeTimeout) and retries
// after transient accept errors.
//
// An admitted connection runs the engine's handshake (wire.ServerHandshake
// with the engine's secret, Listener.Handshake); a peer that asks for
// another channel kind than the endpoint's is refused. The credentials
// taken at accept stay available to the transport (acceptloop.Cred): the
// peer's pid in this pid namespace and its uid.
//
// # Frames
//
// After the handshake both sides exchange wire frames: u8 type, three zero
// bytes, u32 payload length, payload; little-endian throughout. Frame
// types and payloads are the transport's (see its doc.go); BeginFrame,
// EndFrame and Frame build them.
//
// A status, wherever a frame carries one, is wire.Encoder.Status: i32 code
// (0 OK, else a status code of package status), then str message of at
// most wire.MaxStatusMessage bytes. The decoder rejects codes that are not
// known failure codes. core's control protocol uses the same encoding.
//
// # Lease requests and the target's check
//
// The initiator asks for a lease on exactly the ranges it is about to
// touch, in one layout for every transport (Request, BeginRequest,
// AppendRange, DecodeRequest; see request.go): the request's id, its ttl
// in nanoseconds, and 1 to the transport's limit of (op, addr, len). The
// target checks each range with Engine.Acquire for the access the op
// needs (Pins): registered, inside one region, permitted, not being
// unregistered; a refused range is answered with the engine's status. The
// granted ranges stay pinned until the lease ends, so unregistering them
// waits (and past UnregisterTimeout fails with Busy). A range inside a
// region the same grant already pinned, with the permission it needs,
// shares that pin. A Table holds a session's leases: each is released
// exactly once, on the initiator's release, at the lease's deadline (the
// asked ttl, capped by the target, plus the transport's grace period, so
// a stuck initiator cannot keep an unregister waiting past it) or when the
// session ends (a dead initiator's socket closes).
//
// The answer carries one entry per asked range, in request order, each
// starting the same way for every transport (AppendAnswerEntry,
// DecodeAnswerEntry; see answer.go): an i32 status code, 0 for granted;
// a refusal follows it with a str message of at most MaxAnswerMessage
// bytes, a grant with the transport's own fields (shm: the allocation to
// copy through; cuda: the allocation, region and device). A code that is
// not a known failure code is a Protocol error. The answer's head (ids,
// descriptors attached) is the transport's.
//
// # File descriptors
//
// Descriptors travel as SCM_RIGHTS attached to the first byte of the
// frame that announces them (WriteFrame); the sender keeps its own copies.
// The kernel never merges the descriptors of two sendmsg calls into one
// recvmsg, so once a frame has been read the descriptors it announces are
// queued, in order, and it takes them from the front (FDReader.Take). A
// frame that announces more than arrived is a Protocol error.
//
// The receiving rule is strict, the same for every transport: a control
// message that does not parse, a control message other than SCM_RIGHTS,
// or control data the kernel truncated (MSG_CTRUNC, more descriptors than
// the reader has room for) is a status.Protocol error that ends the
// session. Every descriptor of that message and every one still queued is
// closed at once, and the reader returns the same error from then on, so
// the stream cannot be resynchronised by guessing which descriptor
// belonged to which frame. Received descriptors are close-on-exec.
// FDCounts lets the owner count descriptors held and received, to check
// that every one is closed.
package lease
