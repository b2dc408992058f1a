package verbs_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tent-dev/tent/transport/rdma/fakeverbs"
	"github.com/tent-dev/tent/transport/rdma/verbs"
)

// The helper process is this test binary run again with helperEnv set: it
// plays the target side of a connection, one endpoint per device, all
// exposing one buffer, and answers commands on stdin.
const (
	helperEnv    = "VERBS_TEST_HELPER"
	helperDevs   = "VERBS_TEST_HELPER_DEVICES"
	helperSize   = "VERBS_TEST_HELPER_SIZE"
	helperAccess = "VERBS_TEST_HELPER_ACCESS"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		if err := runHelper(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperHello is what the helper announces: per device its QP address and
// the rkey of its buffer there.
type helperHello struct {
	PID   int
	Addrs []verbs.QPAddr
	RKeys []uint32
	Buf   uint64
	Len   uint64
}

func runHelper() error {
	lib, err := verbs.Open("")
	if err != nil {
		return err
	}
	size, _ := strconv.Atoi(os.Getenv(helperSize))
	acc, _ := strconv.Atoi(os.Getenv(helperAccess))
	buf := pattern(size, 42)
	type side struct {
		ctx *verbs.Context
		pd  *verbs.PD
		cq  *verbs.CQ
		qp  *verbs.QP
		mr  *verbs.MR
		// deregistered tells exit the MR is gone already
		deregistered bool
	}
	var sides []*side
	hello := helperHello{PID: os.Getpid(), Buf: uint64(addrOf(buf)), Len: uint64(size)}
	for _, dev := range strings.Split(os.Getenv(helperDevs), ",") {
		s := &side{}
		if s.ctx, err = lib.OpenDevice(dev); err != nil {
			return err
		}
		if s.pd, err = s.ctx.AllocPD(); err != nil {
			return err
		}
		if s.cq, err = s.ctx.CreateCQ(16); err != nil {
			return err
		}
		if s.qp, err = s.pd.CreateRCQP(s.cq, s.cq, verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
			return err
		}
		if s.mr, err = s.pd.RegMR(addrOf(buf), uint64(size), verbs.Access(acc)); err != nil {
			return err
		}
		port, err := s.ctx.QueryPort(1)
		if err != nil {
			return err
		}
		hello.Addrs = append(hello.Addrs, verbs.QPAddr{QPN: s.qp.Num(), PSN: 7, LID: port.LID, Port: 1})
		hello.RKeys = append(hello.RKeys, s.mr.RKey())
		sides = append(sides, s)
	}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(hello); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd := strings.Fields(in.Text())
		switch cmd[0] {
		case "connect": // connect <i> <qpn> <lid>
			i, _ := strconv.Atoi(cmd[1])
			qpn, _ := strconv.ParseUint(cmd[2], 10, 32)
			lid, _ := strconv.ParseUint(cmd[3], 10, 16)
			s := sides[i]
			err = s.qp.ToInit(1, verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			if err == nil {
				err = s.qp.ToRTR(verbs.QPAddr{QPN: uint32(qpn), PSN: 9, LID: uint16(lid)}, verbs.MTU4096)
			}
			if err == nil {
				err = s.qp.ToRTS(7)
			}
		case "sum":
			sum := sha256.Sum256(buf)
			fmt.Println(hex.EncodeToString(sum[:]))
			continue
		case "dereg":
			for _, s := range sides {
				if err = s.mr.Dereg(); err != nil {
					break
				}
				s.deregistered = true
			}
		case "exit":
			for _, s := range sides {
				if !s.deregistered && err == nil {
					err = s.mr.Dereg()
				}
				for _, f := range []func() error{s.qp.Destroy, s.cq.Destroy, s.pd.Dealloc, s.ctx.Close} {
					if err == nil {
						err = f()
					}
				}
			}
			live, cerr := fakeverbs.Counts(lib.Path())
			if err == nil {
				err = cerr
			}
			if err == nil {
				err = lib.Close()
			}
			if err == nil && !live.Zero() {
				err = fmt.Errorf("live objects left: %+v", live)
			}
			if err == nil {
				fmt.Println("ok")
				return nil
			}
		}
		if err != nil {
			fmt.Println("error:", err)
			return err
		}
		fmt.Println("ok")
	}
	return in.Err()
}

// helper is the parent's view of the helper process.
type helper struct {
	cmd   *exec.Cmd
	in    *os.File
	out   *bufio.Reader
	hello helperHello
}

func startHelper(t *testing.T, lib string, devs []string, size int, access verbs.Access) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", verbs.LibraryEnv+"="+lib, helperDevs+"="+strings.Join(devs, ","),
		helperSize+"="+strconv.Itoa(size), helperAccess+"="+strconv.Itoa(int(access)))
	cmd.Stderr = os.Stderr
	inR, inW, err := os.Pipe()
	require.NoError(t, err)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdin, cmd.Stdout = inR, outW
	require.NoError(t, cmd.Start())
	inR.Close()
	outW.Close()
	h := &helper{cmd: cmd, in: inW, out: bufio.NewReader(outR)}
	t.Cleanup(func() {
		inW.Close()
		outR.Close()
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := h.out.ReadString('\n')
	require.NoError(t, err, "the helper's hello")
	require.NoError(t, json.Unmarshal([]byte(line), &h.hello))
	return h
}

func (h *helper) do(t *testing.T, cmd string) string {
	t.Helper()
	_, err := fmt.Fprintln(h.in, cmd)
	require.NoError(t, err)
	line, err := h.out.ReadString('\n')
	require.NoError(t, err, "the helper's answer to %q", cmd)
	return strings.TrimSpace(line)
}

func (h *helper) exit(t *testing.T) {
	t.Helper()
	require.Equal(t, "ok", h.do(t, "exit"), "the helper released everything")
	require.NoError(t, h.cmd.Wait())
}

// connectTo makes one endpoint per device towards the helper's QPs.
func connectTo(t *testing.T, lib *verbs.Library, h *helper, devs []string) []*endpoint {
	t.Helper()
	eps := make([]*endpoint, len(devs))
	for i, dev := range devs {
		eps[i] = newEndpoint(t, lib, dev)
		remote := h.hello.Addrs[i]
		eps[i].connect(t, remote, 9)
		port, err := eps[i].ctx.QueryPort(1)
		require.NoError(t, err)
		require.Equal(t, "ok", h.do(t, fmt.Sprintf("connect %d %d %d", i, eps[i].qp.Num(), port.LID)))
	}
	return eps
}

func withState(t *testing.T) {
	t.Setenv(fakeverbs.StateEnv, t.TempDir())
}

// Checksummed chained writes then reads between two processes, striped
// over one and over two fake NICs; every object released on both sides.
func TestTwoProcessesWriteRead(t *testing.T) {
	for _, devs := range [][]string{{"fake0"}, {"fake0", "fake1"}} {
		t.Run(fmt.Sprintf("%d NICs", len(devs)), func(t *testing.T) {
			withState(t)
			lib, path := openFake(t, "fake0,fake1")
			const slices, slice = 16, 64 << 10
			size := slices * slice
			h := startHelper(t, path, devs, size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			eps := connectTo(t, lib, h, devs)

			src := pattern(size, 9)
			back := make([]byte, size)
			var mrs []*verbs.MR
			for _, e := range eps {
				for _, b := range [][]byte{src, back} {
					mr, err := e.pd.RegMR(addrOf(b), uint64(size), verbs.AccessLocalWrite)
					require.NoError(t, err)
					mrs = append(mrs, mr)
				}
			}
			post := func(op verbs.Op, local []byte) {
				chains := make([][]verbs.SendWR, len(eps))
				for i := 0; i < slices; i++ {
					n := i % len(eps)
					lmr := mrs[2*n]
					if op == verbs.OpRead {
						lmr = mrs[2*n+1]
					}
					chains[n] = append(chains[n], verbs.SendWR{ID: uint64(i), Op: op, LocalAddr: uint64(addrOf(local)) + uint64(i*slice),
						Length: slice, LKey: lmr.LKey(), RemoteAddr: h.hello.Buf + uint64(i*slice), RKey: h.hello.RKeys[n], Signaled: true})
				}
				for n, e := range eps {
					require.NoError(t, e.qp.PostSend(chains[n]))
					for _, c := range waitCompletions(t, e.cq, len(chains[n])) {
						require.Equal(t, verbs.WCSuccess, c.Status, "%v slice %d", op, c.ID)
						require.Equal(t, op, c.Op)
					}
				}
			}
			post(verbs.OpRead, back)
			require.Equal(t, sha256.Sum256(pattern(size, 42)), sha256.Sum256(back), "read the helper's initial bytes")
			post(verbs.OpWrite, src)
			want := sha256.Sum256(src)
			require.Equal(t, hex.EncodeToString(want[:]), h.do(t, "sum"), "the helper holds what was written")
			clear(back)
			post(verbs.OpRead, back)
			require.Equal(t, want, sha256.Sum256(back))

			for _, mr := range mrs {
				require.NoError(t, mr.Dereg())
			}
			for _, e := range eps {
				e.close(t)
			}
			requireNoLiveObjects(t, path)
			h.exit(t)
		})
	}
}

// Across processes the target's MR decides: a write to a read-only MR, an
// access past its end, and any access after it is deregistered complete
// with a remote access error and leave the target's bytes as they were.
func TestTwoProcessesRemoteAccessErrors(t *testing.T) {
	for _, c := range []struct {
		name   string
		access verbs.Access
		op     verbs.Op
		offset uint64
		dereg  bool
	}{
		{name: "read-only written", access: verbs.AccessRemoteRead, op: verbs.OpWrite},
		{name: "past the end", access: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead, op: verbs.OpRead, offset: 4096 - 16},
		{name: "after dereg", access: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead, op: verbs.OpWrite, dereg: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			withState(t)
			lib, path := openFake(t, "fake0")
			h := startHelper(t, path, []string{"fake0"}, 4096, c.access)
			e := connectTo(t, lib, h, []string{"fake0"})[0]
			before := h.do(t, "sum")
			if c.dereg {
				require.Equal(t, "ok", h.do(t, "dereg"))
			}
			local := pattern(4096, 1)
			mr, err := e.pd.RegMR(addrOf(local), 4096, verbs.AccessLocalWrite)
			require.NoError(t, err)
			wr := verbs.SendWR{ID: 1, Op: c.op, LocalAddr: uint64(addrOf(local)), Length: 64, LKey: mr.LKey(),
				RemoteAddr: h.hello.Buf + c.offset, RKey: h.hello.RKeys[0]}
			next := wr
			next.ID, next.Signaled = 2, true
			require.NoError(t, e.qp.PostSend([]verbs.SendWR{wr, next}))
			done := waitCompletions(t, e.cq, 2)
			require.Equal(t, verbs.WCRemoteAccessError, done[0].Status)
			require.Equal(t, verbs.WCWRFlushError, done[1].Status)
			require.Equal(t, before, h.do(t, "sum"), "the target's bytes are untouched")
			require.NoError(t, mr.Dereg())
			e.close(t)
			requireNoLiveObjects(t, path)
			h.exit(t)
		})
	}
}

// A peer process killed mid-batch: what was posted after its death
// completes with retry exceeded, and the QP is in error.
func TestTwoProcessesPeerKilled(t *testing.T) {
	withState(t)
	lib, path := openFake(t, "fake0")
	h := startHelper(t, path, []string{"fake0"}, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	e := connectTo(t, lib, h, []string{"fake0"})[0]
	local := pattern(4096, 1)
	mr, err := e.pd.RegMR(addrOf(local), 4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	wr := func(id uint64) verbs.SendWR {
		return verbs.SendWR{ID: id, Op: verbs.OpWrite, LocalAddr: uint64(addrOf(local)), Length: 1024, LKey: mr.LKey(),
			RemoteAddr: h.hello.Buf, RKey: h.hello.RKeys[0], Signaled: true}
	}
	require.NoError(t, e.qp.PostSend([]verbs.SendWR{wr(1), wr(2)}))
	for _, c := range waitCompletions(t, e.cq, 2) {
		require.Equal(t, verbs.WCSuccess, c.Status)
	}
	require.NoError(t, h.cmd.Process.Kill())
	_ = h.cmd.Wait()
	require.NoError(t, e.qp.PostSend([]verbs.SendWR{wr(3), wr(4)}))
	done := waitCompletions(t, e.cq, 2)
	require.Equal(t, verbs.WCRetryExceeded, done[0].Status)
	require.Equal(t, verbs.WCWRFlushError, done[1].Status)
	require.NoError(t, mr.Dereg())
	e.close(t)
	requireNoLiveObjects(t, path)
}
