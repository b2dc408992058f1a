package acceptloop

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Cred is who the kernel says is at the other end of a Unix socket, as
// recorded at connect (SO_PEERCRED). PID is 0 when the peer's pid is not
// visible in this process's pid namespace.
type Cred struct {
	PID      int
	UID, GID uint32
}

// PeerCred asks the kernel for the credentials of c's peer.
func PeerCred(c *net.UnixConn) (Cred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Cred{}, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, err
	}
	if gerr != nil {
		return Cred{}, fmt.Errorf("SO_PEERCRED: %w", gerr)
	}
	return Cred{PID: int(cred.Pid), UID: cred.Uid, GID: cred.Gid}, nil
}

// PeerUID returns the uid of the process at the other end of a Unix
// socket (PeerCred's UID).
func PeerUID(c *net.UnixConn) (int, error) {
	cred, err := PeerCred(c)
	if err != nil {
		return -1, err
	}
	return int(cred.UID), nil
}

// SameUserOrRoot is the rule for same-host capabilities: a peer may have
// them when it runs as this process's uid, or as root (which could take
// them anyway).
func SameUserOrRoot(peerUID, ownUID uint32) bool {
	return peerUID == ownUID || peerUID == 0
}

// checkSameUser admits a Unix-socket peer running as uid or as root and
// returns its credentials.
func checkSameUser(c net.Conn, uid int) (Cred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Cred{}, fmt.Errorf("peer credentials of a %T connection are unknown", c)
	}
	cred, err := PeerCred(uc)
	if err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if !SameUserOrRoot(cred.UID, uint32(uid)) {
		return Cred{}, fmt.Errorf("peer runs as uid %d, this process as uid %d", cred.UID, uid)
	}
	return cred, nil
}
