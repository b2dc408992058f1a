package acceptloop

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// PeerUID returns the uid of the process at the other end of a Unix
// socket, as the kernel recorded it at connect (SO_PEERCRED).
func PeerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if gerr != nil {
		return -1, gerr
	}
	return int(cred.Uid), nil
}

// checkSameUser admits a Unix-socket peer running as uid or as root.
func checkSameUser(c net.Conn, uid int) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("peer credentials of a %T connection are unknown", c)
	}
	peer, err := PeerUID(uc)
	if err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	if peer != uid && peer != 0 {
		return fmt.Errorf("peer runs as uid %d, this process as uid %d", peer, uid)
	}
	return nil
}
