package tcp

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
)

// stageSize is the host buffer of one staging goroutine: each piece of a
// request on local GPU memory is copied through it, and sent as one
// request of the transport's own (split into chunks over the streams).
const stageSize = 4 * chunkSize

// errGone stops staging a request that was canceled or failed meanwhile.
var errGone = errors.New("tcp: request ended while staging")

// startStaged moves requests on local GPU memory through a host buffer,
// one piece at a time, on a goroutine: a WRITE piece is copied from the
// GPU, then sent; a READ piece is received, then copied to the GPU. Each
// request counts as one chunk, done when its last piece is.
func (t *Transport) startStaged(states []reqState, peers *peerOf) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		for i := range states {
			states[i].settleAll(core.ErrUninstalled)
		}
		return
	}
	t.goroutine(func() { t.runStaged(states, peers) })
}

func (t *Transport) runStaged(states []reqState, peers *peerOf) {
	buf, err := unix.Mmap(-1, 0, stageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		err = status.Errorf(status.NoMemory, "tcp: staging buffer of %d bytes: %v", stageSize, err)
		for i := range states {
			states[i].chunkDone(err, false)
		}
		return
	}
	t.stageBufs.Add(1)
	defer func() {
		_ = unix.Munmap(buf)
		t.stageBufs.Add(-1)
	}()
	for i := range states {
		k, name := peers.at(i)
		s := &states[i]
		err := t.stageOne(s, buf, k, name)
		if err == nil {
			s.markStaged()
		} else if err == errGone {
			err = nil // already ended with its own error
		}
		s.chunkDone(err, false)
	}
}

// stageOne moves request s through buf, piece by piece.
func (t *Transport) stageOne(s *reqState, buf []byte, k peerKey, name string) error {
	host := uint64(uintptr(unsafe.Pointer(&buf[0])))
	local := s.r.LocalRegion
	kind := local.Engine().Memory().Kind(local.Loc.Kind)
	if kind == nil {
		return status.Errorf(status.Unsupported, "tcp: this engine has no %s memory to stage %s with", local.Loc.Kind, local.Loc)
	}
	for off := uint64(0); off < s.n; {
		if s.isDead() {
			return errGone
		}
		if t.isClosed() { // no GPU copy for a piece that cannot be sent
			return core.ErrUninstalled
		}
		n := min(uint64(len(buf)), s.n-off)
		piece := buf[:n]
		if s.op == opWrite {
			if err := s.onDevice(func() error { return kind.CopyOut(piece, s.local+off) }); err != nil {
				return err
			}
			if s.isDead() { // canceled during the copy: do not send it
				return errGone
			}
		}
		sub := []reqState{{t: t, raw: make(chan error, 1), op: s.op, local: host, remote: s.remote + off, n: n, deadline: s.deadline}}
		sub[0].prepare(false)
		t.inflight.Add(1)
		t.start(sub, nil, &peerOf{key: k, name: name})
		if err := <-sub[0].raw; err != nil {
			return err
		}
		if s.op == opRead {
			if err := s.onDevice(func() error { return kind.CopyIn(s.local+off, piece) }); err != nil {
				return err
			}
		}
		t.staged.Add(int64(n))
		off += n
	}
	return nil
}

// onDevice runs a copy to or from the request's GPU memory while it is
// still live (entered, so it cannot complete meanwhile).
func (s *reqState) onDevice(copy func() error) error {
	if !s.enter() {
		return errGone
	}
	err := copy()
	s.exit()
	if err != nil {
		return status.Errorf(status.CodeOf(err), "tcp: staging through host memory: %w", err)
	}
	return nil
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}
