package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

const (
	// opTimeout bounds each background etcd operation (publish, lease).
	opTimeout = 5 * time.Second
	// closeTimeout bounds withdrawing the entry when the engine closes.
	closeTimeout = 2 * time.Second
	// fallbackProbe is how long Resolve waits for etcd before it answers
	// from the watched copy of a name it already knows.
	fallbackProbe = time.Second
	// maxValue is the largest descriptor stored whole; a larger one is
	// stored without its regions (etcd refuses requests over 1.5 MiB by
	// default, and peers fetch the full descriptor over the control link).
	maxValue = 1 << 20
	// Retry backoff of the background publisher and of broken watches.
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
	// maxStaleLeases bounds the leases remembered for revocation.
	maxStaleLeases = 8
)

// Directory is the etcd metadata backend of one engine: it publishes the
// engine's descriptor under a lease and resolves (and watches) peers'.
type Directory struct {
	cfg        config
	cli        *clientv3.Client
	name, key  string
	inc        uint64
	invalidate func(name string)
	log        *slog.Logger // the engine's

	ctx    context.Context // canceled by Close; ends every goroutine
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // wakes the session: a newer descriptor waits

	// timeout bounds every wait for etcd on a caller's behalf (connecting,
	// claiming the name, confirming a publication): the URL's dial_timeout
	// or the engine's timeout, whichever is shorter.
	timeout time.Duration

	startMu sync.Mutex // serializes the first, synchronous publish

	mu       sync.Mutex
	closed   bool
	started  bool
	want     []byte // latest value to publish
	wantGen  uint64
	lease    clientv3.LeaseID   // the lease our key is attached to (0: none)
	stale    []clientv3.LeaseID // leases given up on, revoked when etcd answers
	kaCancel context.CancelFunc // stops the keep-alive of lease
	ka       <-chan *clientv3.LeaseKeepAliveResponse
	watches  map[string]*watched

	// What etcd is known to hold under our key. published is false while
	// that is unknown (before the first write, after the lease was lost,
	// the key deleted or our watch of it broken); publishedGen is the
	// generation of the last confirmed write. publishedCh is closed (and
	// replaced) whenever a write is confirmed, waking Publish's waiters.
	published    bool
	publishedGen uint64
	publishedCh  chan struct{}
	// behind: a wait for confirmation timed out and no write has succeeded
	// since. Publish does not wait while behind, so an etcd outage costs
	// one timeout, not one per registration.
	behind bool

	// Counters for tests and diagnostics.
	writes      atomic.Int64 // successful writes of our key
	timeouts    atomic.Int64 // Publish calls that gave up waiting for etcd
	regrants    atomic.Int64 // leases granted after the first
	invalidated atomic.Int64 // InvalidatePeer calls from watches
	fallbacks   atomic.Int64 // resolves answered from the watched copy
}

// watched is what the watch of one peer name has last seen.
type watched struct {
	desc *wire.SegmentDesc // nil when deleted or malformed
	rev  int64             // etcd revision of desc
}

// Open is the core.DirectoryFactory for "etcd://" URLs: it opens the
// directory at e's Options.Metadata, under Options.MetadataPrefix.
func Open(e *core.Engine) (core.Directory, error) {
	return open(e.Options().Metadata, e, e.InvalidatePeer)
}

// Scope is the etcd namespace: the cluster's endpoints and the key
// prefix. Engines of one process in one namespace reach each other by
// name directly; etcd grants a name in it to one engine only.
func (d *Directory) Scope() (scope string, byAddress bool) {
	return "etcd://" + strings.Join(d.cfg.endpoints, ",") + d.cfg.prefix + "/", false
}

// open connects to etcd and grants the engine's lease, so an unreachable
// etcd fails engine creation within the dial timeout or the engine's
// timeout, whichever is shorter. invalidate is called with a peer's name
// when its watched entry changes.
func open(url string, e *core.Engine, invalidate func(string)) (*Directory, error) {
	cfg, err := parseURL(url, e.Options().MetadataPrefix)
	if err != nil {
		return nil, err
	}
	timeout := cfg.dialTimeout
	if t := e.Options().DefaultTimeout; t > 0 && t < timeout {
		timeout = t
	}
	eps := make([]string, len(cfg.endpoints))
	for i, h := range cfg.endpoints {
		eps[i] = "http://" + h
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: timeout,
		// Detect a dead connection (a vanished host) within ~15 s; etcd
		// refuses pings more often than every 5 s.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               zap.NewNop(), // a library must not write to the host's stderr
		// Reconnect at least every 2 s while etcd is away (gRPC's default
		// backoff grows to 2 minutes), so the engine recovers soon after
		// etcd returns.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		})},
	})
	if err != nil {
		return nil, status.Errorf(status.InvalidArgument, "etcd: client for %s: %w", strings.Join(cfg.endpoints, ","), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Directory{
		cfg: cfg, cli: cli, name: e.Name(), key: cfg.segmentKey(e.Name()), inc: e.Incarnation(),
		invalidate: invalidate, log: e.Logger().With("metadata", "etcd"),
		timeout: timeout, ctx: ctx, cancel: cancel, kick: make(chan struct{}, 1),
		watches: map[string]*watched{}, publishedCh: make(chan struct{}),
	}
	gctx, gcancel := context.WithTimeout(ctx, timeout)
	g, err := cli.Grant(gctx, cfg.ttlSeconds())
	gcancel()
	if err != nil {
		cancel()
		_ = cli.Close()
		return nil, d.wrapErr(err, timeout, "connecting")
	}
	d.lease = g.ID
	d.log.Info("etcd session started", "endpoints", cfg.endpoints, "key", d.key,
		"lease", fmt.Sprintf("%x", int64(g.ID)), "ttl_s", g.TTL)
	return d, nil
}

// Publish stores the descriptor under <prefix>/segments/<name> and
// returns once etcd holds it (or a newer one), so a registration is
// visible in etcd when Register returns. The first call (at engine start)
// claims the name and reports a collision or an unreachable etcd. Later
// calls hand the descriptor to the background publisher and wait for it:
// one goroutine writes the newest descriptor, and every caller waiting
// meanwhile is covered by that write or the next one, so a burst of
// registrations costs one or two writes, not one each. A wait is bounded
// by the directory's timeout; past it Publish fails with Timeout while the
// write goes on in the background (the engine keeps the registration:
// see "When etcd is unreachable" in the package documentation), and until
// a write succeeds again later calls do not wait.
func (d *Directory) Publish(desc *wire.SegmentDesc, encoded []byte) error {
	val, err := value(desc, encoded)
	if err != nil {
		return err
	}
	gen := desc.Generation
	d.mu.Lock()
	started := d.started
	d.mu.Unlock()
	if !started {
		if done, err := d.start(val, gen); done {
			return err
		}
	}
	return d.offer(val, gen)
}

// offer hands val (generation gen) to the session and waits until etcd
// holds it or a newer one.
func (d *Directory) offer(val []byte, gen uint64) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return status.Errorf(status.Closed, "etcd: directory is closed")
	}
	if gen >= d.wantGen {
		d.want, d.wantGen = val, gen
	}
	if d.published && d.publishedGen >= gen {
		d.mu.Unlock()
		return nil
	}
	behind := d.behind
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default: // a kick is already pending; the session will see the newest want
	}
	if behind {
		return status.Errorf(status.Timeout, "etcd: segment %q generation %d: etcd at %s has not confirmed a write since a wait timed out; publishing in the background",
			d.name, gen, strings.Join(d.cfg.endpoints, ","))
	}
	return d.awaitPublished(gen)
}

// awaitPublished waits until etcd is known to hold generation gen (or a
// newer one) under our key, at most d.timeout.
func (d *Directory) awaitPublished(gen uint64) error {
	timer := time.NewTimer(d.timeout)
	defer timer.Stop()
	for {
		d.mu.Lock()
		if d.published && d.publishedGen >= gen {
			d.mu.Unlock()
			return nil
		}
		ch := d.publishedCh
		d.mu.Unlock()
		select {
		case <-ch:
		case <-d.ctx.Done():
			return status.Errorf(status.Closed, "etcd: directory closed while publishing")
		case <-timer.C:
			d.mu.Lock()
			d.behind = true
			d.mu.Unlock()
			d.timeouts.Add(1)
			return status.Errorf(status.Timeout, "etcd: segment %q generation %d: no confirmation from etcd at %s within %v; publishing in the background",
				d.name, gen, strings.Join(d.cfg.endpoints, ","), d.timeout.Round(time.Millisecond))
		}
	}
}

// confirmed records that etcd holds generation gen under our key and wakes
// the waiters.
func (d *Directory) confirmed(gen uint64) {
	d.writes.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.published || gen > d.publishedGen {
		d.publishedGen = gen
	}
	d.published, d.behind = true, false
	close(d.publishedCh)
	d.publishedCh = make(chan struct{})
}

// unconfirmed forgets what etcd holds under our key (the lease was lost,
// the key deleted, or our watch of it broke), so waiters wait for the next
// write.
func (d *Directory) unconfirmed() {
	d.mu.Lock()
	d.published = false
	d.mu.Unlock()
}

// start is the first publish: it claims the name synchronously, within
// d.timeout, and starts the session that keeps the entry published. It
// reports done=false when another call started the session first.
func (d *Directory) start(val []byte, gen uint64) (done bool, _ error) {
	d.startMu.Lock()
	defer d.startMu.Unlock()
	d.mu.Lock()
	closed, started, lease := d.closed, d.started, d.lease
	d.mu.Unlock()
	if closed {
		return true, status.Errorf(status.Closed, "etcd: directory is closed")
	}
	if started {
		return false, nil
	}

	ctx, cancel := context.WithTimeout(d.ctx, d.timeout)
	rev, err := d.claim(ctx, lease, val)
	cancel()
	if err != nil {
		if status.HasCode(err) {
			return true, err
		}
		return true, d.wrapErr(err, d.timeout, fmt.Sprintf("publishing segment %q", d.name))
	}
	kaCtx, kaCancel := context.WithCancel(d.ctx)
	ka, err := d.cli.KeepAlive(kaCtx, lease)
	if err != nil {
		kaCancel()
		return true, d.wrapErr(err, d.timeout, "keeping the lease alive")
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		kaCancel()
		return true, status.Errorf(status.Closed, "etcd: directory closed while publishing")
	}
	d.started = true
	d.want, d.wantGen = val, gen
	d.ka, d.kaCancel = ka, kaCancel
	d.wg.Add(1)
	d.mu.Unlock()
	d.confirmed(gen)
	go d.session(rev)
	return true, nil
}

// Stats reports the directory's counters (core.DirectoryStats):
// published (1 while etcd is known to hold our latest write),
// published_generation, behind (1 after a wait for etcd timed out, until
// a write succeeds), writes, publish_timeouts, lease_regrants,
// watch_invalidations and stale_resolves (answered from the watched copy
// while etcd was away).
func (d *Directory) Stats() map[string]int64 {
	d.mu.Lock()
	published, gen, behind := d.published, d.publishedGen, d.behind
	d.mu.Unlock()
	b2i := func(b bool) int64 {
		if b {
			return 1
		}
		return 0
	}
	return map[string]int64{
		"published":            b2i(published),
		"published_generation": int64(gen),
		"behind":               b2i(behind),
		"writes":               d.writes.Load(),
		"publish_timeouts":     d.timeouts.Load(),
		"lease_regrants":       d.regrants.Load(),
		"watch_invalidations":  d.invalidated.Load(),
		"stale_resolves":       d.fallbacks.Load(),
	}
}

// value is what is stored for desc: its encoding, or, when that is too
// large for etcd, the descriptor without its regions.
func value(desc *wire.SegmentDesc, encoded []byte) ([]byte, error) {
	if encoded == nil {
		b, err := desc.MarshalBinary()
		if err != nil {
			return nil, err
		}
		encoded = b
	}
	if len(encoded) <= maxValue {
		return encoded, nil
	}
	slim := *desc
	slim.Regions = nil
	return slim.MarshalBinary()
}

// claim writes val under our key attached to lease, if the key is absent
// or already ours (our lease, or an earlier lease of this incarnation);
// otherwise it fails with NameInUse. It returns the revision of the write.
// Errors other than NameInUse are the etcd client's, unwrapped.
func (d *Directory) claim(ctx context.Context, lease clientv3.LeaseID, val []byte) (int64, error) {
	put := clientv3.OpPut(d.key, string(val), clientv3.WithLease(lease))
	get := clientv3.OpGet(d.key)
	cmp := clientv3.Compare(clientv3.LeaseValue(d.key), "=", lease) // fast path: an update
	for attempt := 0; attempt < 8; attempt++ {
		resp, err := d.cli.Txn(ctx).If(cmp).Then(put).Else(get).Commit()
		if err != nil {
			return 0, err
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			cmp = clientv3.Compare(clientv3.CreateRevision(d.key), "=", 0)
			continue
		}
		kv := kvs[0]
		if !d.ours(kv.Lease, kv.Value, lease) {
			return 0, d.inUse(ctx, kv)
		}
		cmp = clientv3.Compare(clientv3.ModRevision(d.key), "=", kv.ModRevision)
	}
	return 0, status.Errorf(status.Busy, "etcd: key %s keeps changing under us; not published", d.key)
}

// ours reports whether a stored entry belongs to this engine.
func (d *Directory) ours(kvLease int64, val []byte, lease clientv3.LeaseID) bool {
	if lease != 0 && kvLease == int64(lease) {
		return true
	}
	od, err := wire.UnmarshalSegmentDesc(val)
	return err == nil && od.Incarnation == d.inc
}

// inUse describes who holds our name.
func (d *Directory) inUse(ctx context.Context, kv *mvccpb.KeyValue) error {
	holder := "an entry that is not a valid descriptor"
	if od, err := wire.UnmarshalSegmentDesc(kv.Value); err == nil {
		holder = fmt.Sprintf("a live engine (pid %d, control address %s, incarnation %#x)",
			od.PID, controlAddr(od), od.Incarnation)
	}
	expiry := "; the entry has no lease, so it stays until someone deletes it"
	if kv.Lease != 0 {
		expiry = fmt.Sprintf("; it is held by etcd lease %x", kv.Lease)
		if r, err := d.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil && r.TTL > 0 {
			expiry += fmt.Sprintf(", which expires in %ds unless that engine keeps it alive", r.TTL)
		}
	}
	return status.Errorf(status.NameInUse, "etcd: segment name %q is already in use: key %s holds %s%s",
		d.name, d.key, holder, expiry)
}

func controlAddr(d *wire.SegmentDesc) string {
	for _, ep := range d.Endpoints {
		if ep.Transport == wire.ControlEndpoint {
			return ep.Addr
		}
	}
	return "none"
}

// session keeps our entry published until Close: it renews the lease (the
// client's KeepAlive), publishes newer descriptors, and, when the lease is
// lost (expired while etcd was unreachable, or revoked) or the key deleted,
// grants a new lease and claims the name again, retrying with backoff
// until etcd answers.
func (d *Directory) session(rev int64) {
	defer d.wg.Done()
	own := d.watchOwn(rev + 1)
	dirty := false
	lost := "" // why the entry was lost, until it is published again
	failures := 0
	backoff := minBackoff
	var timer *time.Timer
	var retry <-chan time.Time
	arm := func(after time.Duration) {
		if retry == nil {
			timer = time.NewTimer(after)
			retry = timer.C
		}
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		d.mu.Lock()
		ka := d.ka
		d.mu.Unlock()
		select {
		case <-d.ctx.Done():
			return
		case _, ok := <-ka:
			if !ok { // expired, revoked, or no renewal within the TTL
				d.log.Warn("etcd lease lost; registering again with a new lease", "key", d.key)
				lost = "lease lost"
				d.dropLease()
				dirty = true
				arm(0)
			}
		case <-d.kick:
			dirty = true
			arm(0)
		case wr, ok := <-own:
			if !ok || wr.Err() != nil {
				d.log.Info("etcd watch of our entry ended; checking it again", "key", d.key, "err", wr.Err())
				own = nil // watched again after the next successful claim
				d.unconfirmed()
				dirty = true
				arm(0)
				continue
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					d.log.Warn("etcd entry deleted by someone else; publishing it again", "key", d.key)
					lost = "entry deleted"
					d.unconfirmed()
					dirty = true
					arm(0)
				}
			}
		case <-retry:
			retry = nil
			if !dirty {
				continue
			}
			rev, err := d.sync(own == nil)
			if err != nil {
				failures++
				d.log.Info("etcd publish failed; retrying", "key", d.key, "attempt", failures, "retry_in", backoff, "err", err)
				arm(backoff)
				backoff = min(backoff*2, maxBackoff)
				continue
			}
			if lost != "" || failures > 0 {
				d.log.Warn("etcd registration restored", "key", d.key, "after", lost, "failed_attempts", failures)
			} else {
				d.log.Debug("etcd entry published", "key", d.key, "revision", rev)
			}
			lost, failures = "", 0
			dirty, backoff = false, minBackoff
			if own == nil {
				own = d.watchOwn(rev + 1)
			}
		}
	}
}

// watchOwn watches our key from rev, to notice its deletion.
func (d *Directory) watchOwn(rev int64) clientv3.WatchChan {
	return d.cli.Watch(clientv3.WithRequireLeader(d.ctx), d.key, clientv3.WithRev(rev))
}

// dropLease forgets the current lease (remembering it for revocation).
func (d *Directory) dropLease() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.kaCancel != nil {
		d.kaCancel()
	}
	if d.lease != 0 && len(d.stale) < maxStaleLeases {
		d.stale = append(d.stale, d.lease)
	}
	d.lease, d.ka, d.kaCancel = 0, nil, nil
	d.published = false
}

// sync publishes the latest descriptor, with a new lease if needed. It
// writes nothing when etcd already holds the latest descriptor under a
// live lease, unless force is set. A revision of 0 means nothing was
// written.
func (d *Directory) sync(force bool) (int64, error) {
	ctx, cancel := context.WithTimeout(d.ctx, opTimeout)
	defer cancel()
	d.mu.Lock()
	lease, val, gen := d.lease, d.want, d.wantGen
	upToDate := lease != 0 && d.published && d.publishedGen >= gen
	d.mu.Unlock()
	if upToDate && !force {
		return 0, nil
	}
	if lease == 0 {
		g, err := d.cli.Grant(ctx, d.cfg.ttlSeconds())
		if err != nil {
			return 0, err
		}
		kaCtx, kaCancel := context.WithCancel(d.ctx)
		ka, err := d.cli.KeepAlive(kaCtx, g.ID)
		if err != nil {
			kaCancel()
			return 0, err
		}
		d.regrants.Add(1)
		lease = g.ID
		d.mu.Lock()
		d.lease, d.ka, d.kaCancel = g.ID, ka, kaCancel
		d.mu.Unlock()
	}
	rev, err := d.claim(ctx, lease, val)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		d.log.Warn("etcd lease lost; registering again with a new lease", "key", d.key,
			"lease", fmt.Sprintf("%x", int64(lease)))
		d.dropLease()
	}
	if err != nil {
		return 0, err
	}
	d.confirmed(gen)
	d.revokeStale(ctx)
	return rev, nil
}

// revokeStale revokes leases given up on; our key is no longer attached
// to them, so this deletes nothing of ours.
func (d *Directory) revokeStale(ctx context.Context) {
	d.mu.Lock()
	stale := d.stale
	d.stale = nil
	d.mu.Unlock()
	var keep []clientv3.LeaseID
	for _, id := range stale {
		if _, err := d.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			keep = append(keep, id)
		}
	}
	if len(keep) > 0 {
		d.mu.Lock()
		d.stale = append(keep, d.stale...)
		d.mu.Unlock()
	}
}

// Close stops publishing and watching, deletes our entry (only if it is
// still ours) and revokes our leases, waiting at most closeTimeout for
// etcd; an entry left behind expires with its lease.
func (d *Directory) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return status.Errorf(status.Closed, "etcd: directory already closed")
	}
	d.closed = true
	d.mu.Unlock()
	d.cancel()
	d.wg.Wait()

	d.mu.Lock()
	leases := append([]clientv3.LeaseID(nil), d.stale...)
	if d.lease != 0 {
		leases = append(leases, d.lease)
	}
	lease := d.lease
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	err := d.withdraw(ctx, lease)
	for _, id := range leases {
		if _, rerr := d.cli.Revoke(ctx, id); rerr != nil && !errors.Is(rerr, rpctypes.ErrLeaseNotFound) && err == nil {
			err = d.wrapErr(rerr, closeTimeout, "revoking the lease")
		}
	}
	_ = d.cli.Close()
	return err
}

// withdraw deletes our key if it is still ours.
func (d *Directory) withdraw(ctx context.Context, lease clientv3.LeaseID) error {
	resp, err := d.cli.Get(ctx, d.key)
	if err != nil {
		return d.wrapErr(err, closeTimeout, fmt.Sprintf("withdrawing segment %q", d.name))
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	kv := resp.Kvs[0]
	if !d.ours(kv.Lease, kv.Value, lease) {
		return nil
	}
	_, err = d.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(d.key), "=", kv.ModRevision)).
		Then(clientv3.OpDelete(d.key)).Commit()
	return d.wrapErr(err, closeTimeout, fmt.Sprintf("withdrawing segment %q", d.name))
}
