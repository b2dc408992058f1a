package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
)

// childEnv makes gpucheck the peer process.
const childEnv = "TENT_GPUCHECK_CHILD"

// Seeds of the patterns the peer's buffers start with.
const (
	seedPeerVRAM   = 1 // the peer's engine allocation (cuda transport)
	seedPeerMalloc = 3 // the peer's cuMemAlloc memory (tcp staging)
)

// hello is what the peer reports once its buffers are ready.
type hello struct {
	Name string `json:"name"`
	// VRAM: Engine.Alloc(-size, "cuda:<peer-dev>"), exportable.
	VRAM uint64 `json:"vram"`
	// Malloc: cuMemAlloc(-staged-size) registered with its location
	// detected: "cudaMalloc" memory, which only tcp staging reaches.
	Malloc    uint64 `json:"malloc"`
	MallocLoc string `json:"malloc_location"`
}

// child runs the peer: an engine (cuda, tcp) with the two buffers of hello;
// commands on stdin, one answer line each: "sum vram|malloc N" (sha256 of
// the first N bytes), "leaks" (the fake driver's live objects, "" on a
// real driver), "exit" (free, close, then one last line: leaks).
func child() error {
	d, err := cu.Default()
	if err != nil {
		return err
	}
	e, err := newEngine()
	if err != nil {
		return err
	}
	defer e.Close()
	loc := "cuda:" + strconv.Itoa(*peerDev)
	vram, err := e.Alloc(*maxSize, loc, core.PermRemoteRead|core.PermRemoteWrite)
	if err != nil {
		return err
	}
	if err := fill(d, vram.Addr, *maxSize, seedPeerVRAM, *chunk); err != nil {
		return err
	}
	mem, err := d.MemAlloc(*peerDev, *stagedSize)
	if err != nil {
		return err
	}
	defer d.MemFree(mem)
	if err := fill(d, mem, *stagedSize, seedPeerMalloc, *chunk); err != nil {
		return err
	}
	malloc, err := e.Register(core.RegionDesc{Addr: mem, Len: *stagedSize}, core.PermRemoteRead|core.PermRemoteWrite)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(hello{Name: e.Name(), VRAM: vram.Addr, Malloc: mem, MallocLoc: malloc.Loc.String()})
	fmt.Println(string(b))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 3 && f[0] == "sum":
			n, _ := strconv.ParseUint(f[2], 10, 64)
			addr := vram.Addr
			if f[1] == "malloc" {
				addr = mem
			}
			s, err := sum(d, addr, n, *chunk)
			if err != nil {
				fmt.Println("error", err)
			} else {
				fmt.Println(s)
			}
		case len(f) == 1 && f[0] == "exit":
			if err := e.Unregister(malloc); err != nil {
				return err
			}
			if err := e.Free(vram); err != nil {
				return err
			}
			if err := e.Close(); err != nil {
				return err
			}
			if err := d.MemFree(mem); err != nil {
				return err
			}
			mem = 0
			fmt.Println("leaks " + fakeLeaks(d))
			return nil
		default:
			fmt.Println("error unknown command", f)
		}
	}
	return nil
}

// fakeLeaks is the fake driver's live objects other than contexts ("" when
// none, or when the driver is the real one, which has no such count).
func fakeLeaks(d *cu.Driver) string {
	f, err := fakecuda.Open(d.Path())
	if err != nil {
		return ""
	}
	return f.Counters().Leaks()
}

type peerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func (p *peerProc) kill() { _ = p.cmd.Process.Kill() }

func (p *peerProc) ask(line string) (string, error) {
	if _, err := fmt.Fprintln(p.in, line); err != nil {
		return "", err
	}
	s, err := p.out.ReadString('\n')
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "error") {
		return "", fmt.Errorf("peer: %s", s)
	}
	return s, err
}

func startPeer() (*peerProc, hello, error) {
	var h hello
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, h, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, h, err
	}
	if err := cmd.Start(); err != nil {
		return nil, h, err
	}
	p := &peerProc{cmd: cmd, in: in, out: bufio.NewReader(out)}
	line, err := p.out.ReadString('\n')
	if err != nil {
		p.kill()
		_ = cmd.Wait()
		return nil, h, fmt.Errorf("peer did not start: %v", err)
	}
	if err := json.Unmarshal([]byte(line), &h); err != nil {
		p.kill()
		_ = cmd.Wait()
		return nil, h, fmt.Errorf("peer hello %q: %v", line, err)
	}
	return p, h, nil
}
