//go:build linux

package shm

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/internal/testenv"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/internal/lease"
	"github.com/tent-dev/tent/wire"
)

// attackCmd is a peer command ("attack ENDPOINT ADDR LEN"): a dishonest
// initiator that speaks the shm protocol itself, takes a READ lease on
// [ADDR, ADDR+LEN) of the target, and tries to turn every descriptor it
// receives into write access: reopening it read-write through
// /proc/self/fd and mapping that PROT_WRITE|MAP_SHARED, then writing 0xEE
// over the whole mapping. It answers "fds=N wrote=M granted=CODE".
func attackCmd(e *core.Engine, args []string) (string, error) {
	if len(args) != 3 {
		return "", fmt.Errorf("usage: attack ENDPOINT ADDR LEN")
	}
	addr, err1 := strconv.ParseUint(args[1], 10, 64)
	n, err2 := strconv.ParseUint(args[2], 10, 64)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("bad address or length")
	}
	nc, err := net.Dial("unix", args[0])
	if err != nil {
		return "", err
	}
	defer nc.Close()
	uc := nc.(*net.UnixConn)
	if _, err := wire.ClientHandshake(uc, wire.HandshakeConfig{
		Secret: e.Options().Secret, Deadline: time.Now().Add(10 * time.Second), LocalName: "attacker",
	}, kindShm); err != nil {
		return "", err
	}
	if _, err := uc.Write(appendLease(nil, 1, time.Second, []*core.Request{{Op: core.OpRead, Remote: addr, Len: n}})); err != nil {
		return "", err
	}
	var held, recv atomic.Int64
	fr := lease.NewFDReader(uc, maxGrantFDs, lease.FDCounts{Held: &held, Received: &recv})
	defer fr.CloseAll()
	_ = uc.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, payload, err := wire.ReadFrame(fr, maxFrame, nil)
	if err != nil || typ != frameGrant {
		return "", fmt.Errorf("no grant: type %d, %v", typ, err)
	}
	d := wire.NewDecoder(payload)
	var h grantHead
	decodeGrantHead(&d, &h)
	ents := make([]grantEntry, 1)
	if err := d.Err(); err != nil {
		return "", err
	}
	if err := decodeGrantEntries(payload[d.Offset():], ents); err != nil {
		return "", err
	}
	fds, err := fr.Take(len(h.fds))
	if err != nil {
		return "", err
	}
	wrote := 0
	for i, fd := range fds {
		defer unix.Close(fd)
		rw, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		m, err := unix.Mmap(rw, 0, int(h.fds[i].size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		unix.Close(rw)
		if err != nil {
			continue
		}
		for k := range m {
			m[k] = 0xEE
		}
		_ = unix.Munmap(m)
		wrote++
	}
	return fmt.Sprintf("fds=%d wrote=%d granted=%d", recv.Load(), wrote, ents[0].code), nil
}

// TestReadOnlyGrantHandsNoWritableDescriptor runs the reopen attack from
// a real peer process against a read-only allocation: the peer gets its
// read granted but no descriptor, so the target's memory is unchanged.
// The same attack on a read-write allocation, where writing is granted,
// shows that the attack itself works.
func TestReadOnlyGrantHandsNoWritableDescriptor(t *testing.T) {
	target, tr := newEngine(t, core.Options{})
	attacker := peertest.Start(t, peertest.Config{Transports: []string{"shm"}})
	alloc := func(perm core.Perm) (*core.Region, []byte) {
		r, err := target.Alloc(8192, "cpu", perm)
		require.NoError(t, err)
		mem := host.Bytes(r.Addr, r.Len)
		copy(mem, bytes.Repeat([]byte{0x5A}, len(mem)))
		return r, append([]byte(nil), mem...)
	}

	ro, before := alloc(core.PermRemoteRead)
	ans, err := attacker.Cmd("attack %s %d %d", tr.addr, ro.Addr, ro.Len)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("fds=0 wrote=0 granted=%d", status.OK), ans, "the read is granted, with no descriptor")
	require.Equal(t, before, host.Bytes(ro.Addr, ro.Len), "read-only memory unchanged")
	require.Zero(t, tr.Stats()["fds_sent"])

	rw, _ := alloc(rw)
	ans, err = attacker.Cmd("attack %s %d %d", tr.addr, rw.Addr, rw.Len)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("fds=1 wrote=1 granted=%d", status.OK), ans)
	require.Equal(t, bytes.Repeat([]byte{0xEE}, int(rw.Len)), host.Bytes(rw.Addr, rw.Len),
		"a read-write allocation's descriptor writes it: that is what its permission grants")
	require.EqualValues(t, 1, tr.Stats()["fds_sent"])
}

// Read-only engine allocations stay readable between processes of one host
// (process_vm instead of a mapping) and refuse writes with the target's
// PermissionDenied; no descriptor reaches the initiator.
func TestReadOnlyAllocationOverShm(t *testing.T) {
	peer := startPeer(t, peertest.Buffer{Size: 1 << 20, Perm: core.PermRemoteRead, Alloc: true})
	e, tr := newEngine(t, core.Options{})
	seg := openSeg(t, e, peer.Name)
	local := localBuf(t, e, 1<<20)
	remote := peer.Buffers[0].Addr
	before := sum(t, peer, 0)

	code, st, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local), Segment: seg,
		Remote: remote, Len: 1 << 20}}, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, ID, st[0].Transport)
	require.Equal(t, peertest.Pattern(0, 1<<20), local)
	require.EqualValues(t, 1<<20, tr.Stats()["bytes_process_vm"])
	require.Zero(t, tr.Stats()["fds_received"])
	require.Zero(t, tr.Stats()["mappings"])

	code, st, _ = run(t, e, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg,
		Remote: remote, Len: 4096}}, core.TransferOptions{})
	require.Equal(t, status.PermissionDenied, code)
	require.Equal(t, status.PermissionDenied, st[0].Code)
	require.Equal(t, before, sum(t, peer, 0), "nothing written")
	require.Zero(t, tr.Stats()["fds_received"])
}

// The shm endpoint serves only its own uid or root: a peer of another
// user is cut off at accept, before the handshake, so it can ask for no
// lease at all (no memfd, no process_vm on the target's behalf). The same
// attack as above, from a process of uid 65534.
func TestOtherUserRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "running a peer as another user needs root")
	}
	setpriv := testenv.RequireBinary(t, "setpriv")
	target, tr := newEngine(t, core.Options{})
	attacker := peertest.Start(t, peertest.Config{Transports: []string{"shm"}, Binary: sharedCopy(t, os.Args[0]),
		Exec: []string{setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"}})
	r, err := target.Alloc(8192, "cpu", rw)
	require.NoError(t, err)
	mem := host.Bytes(r.Addr, r.Len)
	copy(mem, bytes.Repeat([]byte{0x5A}, len(mem)))
	before := append([]byte(nil), mem...)

	_, err = attacker.Cmd("attack %s %d %d", tr.addr, r.Addr, r.Len)
	require.Error(t, err, "another user's handshake must not succeed")
	require.EqualValues(t, 1, target.Stats().Listeners["shm"].PeerRejected, "refused at accept")
	require.Zero(t, target.Stats().Listeners["shm"].Authenticated)
	require.Equal(t, before, mem)
	require.Zero(t, tr.Stats()["fds_sent"])
	require.Zero(t, tr.Stats()["leases"])
	require.NoError(t, attacker.Stop())
}

// sharedCopy copies the executable at path into a directory every user
// can enter, and returns the copy's path.
func sharedCopy(t *testing.T, path string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dst := filepath.Join(dir, filepath.Base(path))
	require.NoError(t, os.WriteFile(dst, b, 0o755))
	return dst
}
