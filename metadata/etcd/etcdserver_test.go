package etcd

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tent-dev/tent/internal/testenv"
)

// etcdServer is a single-member etcd on loopback for one test: random
// free ports, data in t.TempDir(). Stop and Start keep the data dir and
// the ports, as a restarted etcd would.
type etcdServer struct {
	t          testing.TB
	bin        string
	dir        string
	clientAddr string
	peerAddr   string
	args       []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

// startEtcd starts etcd, or skips the test when no etcd binary exists
// (fails it with CI=true; see internal/testenv).
func startEtcd(t testing.TB) *etcdServer {
	t.Helper()
	bin := testenv.RequireBinary(t, "etcd")
	dir := t.TempDir()
	s := &etcdServer{t: t, bin: bin, dir: dir, clientAddr: freePort(t), peerAddr: freePort(t)}
	curl, purl := "http://"+s.clientAddr, "http://"+s.peerAddr
	s.args = []string{
		"--name", "tent-test",
		"--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", curl, "--advertise-client-urls", curl,
		"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
		"--initial-cluster", "tent-test=" + purl,
		"--initial-cluster-state", "new",
		// A single member elects itself after the election timeout: keep
		// it short so a restart is quick. Minimum lease TTL = 1.5 x this.
		"--heartbeat-interval", "50", "--election-timeout", "500",
	}
	help, _ := exec.Command(bin, "--help").CombinedOutput()
	if strings.Contains(string(help), "--unsafe-no-fsync") {
		s.args = append(s.args, "--unsafe-no-fsync")
	}
	if strings.Contains(string(help), "--logger") {
		s.args = append(s.args, "--logger", "zap", "--log-level", "warn")
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// URL is the metadata URL for engines, with extra query parameters.
func (s *etcdServer) URL(query string) string {
	u := "etcd://" + s.clientAddr
	if query != "" {
		u += "?" + query
	}
	return u
}

// Start runs etcd and waits until it answers.
func (s *etcdServer) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.t.Fatal("etcd already running")
	}
	log, err := os.OpenFile(filepath.Join(s.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "ETCD_UNSUPPORTED_ARCH="+goarchForEtcd())
	if err := cmd.Start(); err != nil {
		log.Close()
		s.t.Fatalf("starting etcd: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done, s.log = cmd, done, log

	cli := s.client()
	defer cli.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "/health-probe")
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			s.t.Fatalf("etcd exited at start:\n%s", s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("etcd did not answer within 20s: %v\n%s", err, s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop ends etcd (SIGTERM, then SIGKILL) and waits for it.
func (s *etcdServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused etcd handles SIGTERM once it runs
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.log.Close()
	s.cmd = nil
}

// Pause freezes etcd (SIGSTOP): connections stay open and requests wait
// unanswered until Resume.
func (s *etcdServer) Pause() { s.signal(syscall.SIGSTOP) }

// Resume lets a paused etcd run again (SIGCONT).
func (s *etcdServer) Resume() { s.signal(syscall.SIGCONT) }

func (s *etcdServer) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatal("etcd is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
}

func (s *etcdServer) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "etcd.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// client returns a test client of the server (the caller closes it).
func (s *etcdServer) client() *clientv3.Client {
	s.t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"http://" + s.clientAddr}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		s.t.Fatal(err)
	}
	return cli
}

// goarchForEtcd: etcd 3.4 refuses to start on architectures other than
// amd64 (and ppc64le) unless ETCD_UNSUPPORTED_ARCH names the one it runs on.
func goarchForEtcd() string { return runtime.GOARCH }
