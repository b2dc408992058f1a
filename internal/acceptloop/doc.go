// Package acceptloop is the one accept loop behind every listener of an
// engine: the engine's TCP listener and the shm and cuda transports'
// Unix-domain listeners.
//
// A listener must outlive its worst moment. Accept fails for reasons that
// pass (EMFILE and ENFILE when the process or host runs out of
// descriptors, ECONNABORTED, ENOBUFS): the loop backs off (MinBackoff,
// doubling to MaxBackoff, reset by the next success), counts the error,
// logs it, and accepts again. Only net.ErrClosed ends it.
//
// A connection is unauthenticated from accept until its owner reports the
// handshake done (Pending.Done). The loop bounds what such connections
// can hold:
//
//   - at most MaxUnauthenticated at once: a new connection past the bound
//     closes the oldest unauthenticated one, so idle connections cannot
//     keep a real client out (it finishes its handshake in a round trip,
//     long before it is the oldest);
//   - each for at most HandshakeTimeout: its deadline is set on accept,
//     and a timer closes it if the handshake is not done by then.
//
// With SameUser, a Unix-socket peer must run as this process's user or as
// root (SO_PEERCRED); abstract-namespace sockets have no file permissions
// to do that job.
//
// Every outcome is counted in Stats, for the engine's stats.
package acceptloop
