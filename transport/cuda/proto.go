package cuda

import (
	"time"

	"golang.org/x/sys/unix"
)

// KindCUDA is the channel kind the transport asks for in the handshake,
// on its own Unix listener and on the engine's TCP listener (lease-only
// sessions for fabric imports). Declared in Spec, so an engine refuses to
// be built with another transport claiming it.
const KindCUDA uint8 = 4

// Frames of a session, after the handshake (wire framing: type, three
// zero bytes, u32 length, payload). Requests carry a u64 id that the reply
// echoes. A status is wire's (Encoder.Status): an i32 code and a str message.
const (
	// S->C, first frame: u64 incarnation of the target engine, u32 pid.
	msgHello uint8 = 1
	// C->S: u64 id, u64 alloc id.
	msgImport uint8 = 2
	// S->C: u64 id, u32 number of fds (0 or 1), status, u64 base, u64 size;
	// the fd travels as SCM_RIGHTS with this frame's bytes.
	msgImported uint8 = 3
	// C->S: a lease.Request (u64 id, u64 ttl in ns, count n, n × (u8 op,
	// u64 addr, u64 len)).
	msgLease uint8 = 4
	// S->C: u64 id, u64 lease id (0: nothing granted), count n, n ×
	// answer entry (lease.AppendAnswerEntry: i32 code, a refusal's str
	// message), granted entries followed by u64 alloc id, u64 region addr,
	// u64 region len, u8 is cuda, str device uuid.
	msgLeased uint8 = 5
	// C->S: u64 lease id. No reply.
	msgRelease uint8 = 6
	// S->C push: count n, n × u64 alloc id: allocations this session
	// imported that are no longer registered.
	msgRevoke uint8 = 7
)

const (
	// maxFrame bounds every frame of a session.
	maxFrame = 16 << 20
	// maxRanges bounds the ranges of one lease; clients split larger batches.
	maxRanges = 1 << 14
	// maxTTL bounds how long a lease may be asked for.
	maxTTL = time.Hour
	// leaseGrace is how long past the initiator's deadline the target keeps
	// a lease that was not released: the time copies queued just before
	// the deadline have to finish.
	leaseGrace = 5 * time.Second
	// maxFDsPerMsg bounds the descriptors of one received message (an
	// import reply carries one).
	maxFDsPerMsg = 8
	// maxUUID bounds a device uuid string.
	maxUUID = 64
)

// closeFDs closes descriptors this side exported (the message carried
// its own duplicates) or received for nothing.
func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}
