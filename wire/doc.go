// Package wire defines the binary formats tent engines speak to each other:
// the segment descriptor, the connection handshake and control-message
// framing, plus the Encoder and Decoder they are built from.
//
// Everything a peer sends is untrusted. The formats are hand-written
// little-endian layouts, never gob, JSON or reflection; every length and
// count is checked against a fixed limit and against the bytes actually
// available before anything is allocated for it, and decoders reject
// trailing bytes, unknown flag bits and non-zero reserved fields. Every
// decode failure is a status.Protocol error whose message names the field
// or offset; an unknown format or protocol version is
// status.VersionMismatch.
//
// # Primitive encoding
//
// Integers are little-endian, fixed width (u8, u16, u32, u64). A "str" or
// "bytes" field is a u32 length followed by that many bytes; a "name16" is a
// u16 length followed by that many bytes. A "count" is a u32 number of
// elements that follow.
//
// # Segment descriptor (format version 1)
//
//	offset size   field
//	0      4      magic "TSEG"
//	4      2      u16 format version (1)
//	6      2      u16 flags (0; any bit set is rejected)
//	8      4+n    str name          1 <= n <= MaxNameLen (1024)
//	.      4+n    str machine id    n <= MaxNameLen
//	.      4      u32 pid
//	.      8      u64 incarnation
//	.      8      u64 generation
//	.      4      count endpoints   <= MaxEndpoints (64), each:
//	         4+n    str transport   1 <= n <= MaxTransportLen (64)
//	         4+n    str address     n <= MaxNameLen
//	.      4      count regions     <= MaxRegions (1<<20), each (>= 33 bytes):
//	         8      u64 addr
//	         8      u64 len         > 0, addr+len < 2^64
//	         1      u8 perm         bit 0 remote read, bit 1 remote write, others 0
//	         4+n    str location    n <= MaxLocationLen (64), e.g. "cpu", "cuda:1"
//	         8      u64 alloc id    0 unless engine-allocated, shareable memory
//	         4      count attachments <= MaxAttachments (8), each:
//	           4+n    str transport 1 <= n <= MaxTransportLen
//	           4+n    bytes data    n <= MaxAttachmentLen (4096)
//
// Regions are sorted by address and do not overlap (adjacent is fine). The
// whole encoding is at most MaxDescriptorSize (64 MiB). The same rules are
// enforced when encoding (status.InvalidArgument) and decoding
// (status.Protocol), so a valid descriptor has exactly one encoding.
//
// # Handshake (protocol version 1)
//
// Every connection starts with four messages. The hellos have the same
// layout in every protocol version, so any two builds can at least agree
// that they disagree.
//
//	client hello (42+n bytes), client -> server
//	0   4   magic "TENT"
//	4   2   u16 highest protocol version the client speaks
//	6   1   u8 channel kind (chosen by the caller: metadata, data, ...)
//	7   1   u8 flags: bit 0 = client has a secret; other bits 0
//	8   32  client nonce (crypto/rand)
//	40  2+n name16 client name, n <= MaxNameLen
//
//	server hello (40 bytes), server -> client
//	0   4   magic "TENT"
//	4   2   u16 version: the chosen one, min(client's, server's highest);
//	        on a version refusal, the server's highest
//	6   1   u8 verdict
//	7   1   u8 flags: bit 0 = server has a secret
//	8   32  server nonce (zero on refusal)
//
//	client finish (33 bytes, or 1 byte on refusal), client -> server
//	0   1   u8 verdict
//	1   32  client proof (zero without a secret)
//
//	server finish (35+n bytes, or 1 byte on refusal), server -> client
//	0   1   u8 verdict
//	1   32  server proof (zero without a secret)
//	33  2+n name16 server name, n <= MaxNameLen
//
// Verdicts: 0 ok, 1 no common version, 2 the sender requires a secret the
// peer lacks, 3 the peer has a secret the sender lacks, 4 the peer's proof
// did not verify. A side that refuses sends its verdict and fails; the
// other side fails with the matching code, so both report the same cause:
// VersionMismatch for 1, AuthFailed for 2 to 4. Garbage, a wrong magic, an
// unknown verdict or flag, or an over-long name is a Protocol error; a
// missed deadline is Timeout.
//
// Authentication is on when a side has a non-empty secret, and both sides
// must agree: a side with a secret never continues unauthenticated, and a
// side without one refuses a peer that has one. The proofs are
//
//	client proof = HMAC-SHA256(secret, "tent-client" || version u16 || kind u8 ||
//	                           client nonce || server nonce || name16 client name)
//	server proof = HMAC-SHA256(secret, "tent-server" || version u16 || kind u8 ||
//	                           client nonce || server nonce || name16 client name ||
//	                           name16 server name)
//
// and are compared with hmac.Equal. The labels differ, so one role's proof
// never passes for the other's. The server nonce is fresh per connection,
// so a recorded client proof does not verify again, and the version and
// kind are bound into the proofs, so they cannot be altered in flight. The
// server reveals nothing that depends on the secret, nor its name, until
// the client's proof has verified.
//
// # Frames
//
// Control messages after the handshake are frames:
//
//	0   1   u8 type
//	1   3   reserved, zero (non-zero is a Protocol error)
//	4   4   u32 payload length, <= the reader's limit <= MaxFrame (64 MiB)
//	8   n   payload
//
// A frame is written with one Write call (one writev on TCP and Unix
// sockets), so frames from concurrent writers never interleave on a
// net.Conn. ReadFrame grows its buffer as bytes arrive rather than trusting
// the length, so a lying header costs the sender as much as the receiver.
//
// # Versioning
//
// The descriptor carries a format version and the handshake a protocol
// version; they change independently. A decoder accepts exactly the
// versions it knows: there is no room for silently ignored extensions, as
// trailing bytes and unknown flags are errors. Any change to a layout after
// the fixed prefix (magic and version, plus the verdict and flags of the
// handshake hellos) bumps its version. A build that speaks several handshake
// versions advertises its highest; the server chooses the lower of the two
// highests and refuses if that is below its minimum, and the client refuses
// a choice outside its own range. Limits are part of a format: raising one
// needs a new version, because an older peer would reject the result.
package wire
