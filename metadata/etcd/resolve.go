package etcd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Resolve reads the descriptor published under name, waiting for etcd
// until deadline, and watches the key from then on. When etcd does not
// answer and the name is already watched, the last watched value is
// returned after fallbackProbe: established peers keep working while etcd
// is away (the engine verifies the descriptor over the peer's control
// link anyway). A name never resolved fails with Timeout or TransportError.
func (d *Directory) Resolve(name string, deadline time.Time) (*wire.SegmentDesc, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, status.Errorf(status.Closed, "etcd: directory is closed")
	}
	var cached *wire.SegmentDesc
	if w := d.watches[name]; w != nil {
		cached = w.desc
	}
	d.mu.Unlock()

	now := time.Now()
	if !deadline.After(now) {
		return nil, status.Errorf(status.Timeout, "etcd: resolving segment %q: deadline already passed", name)
	}
	limit := deadline
	if cached != nil && deadline.Sub(now) > fallbackProbe {
		limit = now.Add(fallbackProbe)
	}
	key := d.cfg.segmentKey(name)
	ctx, cancel := context.WithDeadline(d.ctx, limit)
	resp, err := d.cli.Get(ctx, key)
	cancel()
	if err != nil {
		werr := d.wrapErr(err, limit.Sub(now), fmt.Sprintf("resolving segment %q", name))
		if c := status.CodeOf(werr); cached != nil && (c == status.Timeout || c == status.TransportError) {
			d.fallbacks.Add(1)
			return cached, nil
		}
		return nil, werr
	}
	if len(resp.Kvs) == 0 {
		d.record(name, nil, resp.Header.Revision)
		return nil, status.Errorf(status.NotFound, "etcd: segment %q is not registered (no key %s in etcd at %s)",
			name, key, strings.Join(d.cfg.endpoints, ","))
	}
	kv := resp.Kvs[0]
	desc, err := decode(name, key, kv.Value)
	if err != nil {
		d.record(name, nil, kv.ModRevision)
		return nil, err
	}
	d.startWatch(name, key, resp.Header.Revision+1)
	d.record(name, desc, kv.ModRevision)
	return desc, nil
}

// decode checks a stored descriptor: the wire codec's limits and
// validation, and that it names the segment it is stored under.
func decode(name, key string, b []byte) (*wire.SegmentDesc, error) {
	d, err := wire.UnmarshalSegmentDesc(b)
	if err != nil {
		return nil, status.Errorf(status.CodeOf(err), "etcd: segment %q: bad descriptor under %s: %w", name, key, err)
	}
	if d.Name != name {
		return nil, status.Errorf(status.Protocol, "etcd: segment %q: the descriptor under %s names segment %q", name, key, d.Name)
	}
	return d, nil
}

// record stores what is known of name at revision rev, if the name is
// watched and rev is not older than what is stored.
func (d *Directory) record(name string, desc *wire.SegmentDesc, rev int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.watches[name]; w != nil && rev >= w.rev {
		w.desc, w.rev = desc, rev
	}
}

// startWatch watches name's key from rev, once per name.
func (d *Directory) startWatch(name, key string, rev int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.watches[name] != nil {
		return
	}
	d.watches[name] = &watched{}
	d.wg.Add(1)
	go d.watch(name, key, rev)
}

// watch invalidates the engine's cached descriptor of name on every
// change of its key (a new generation, a restarted peer, a deletion when
// the peer closes or its lease expires) until Close. A broken watch is
// resumed from the last revision seen, so no change is missed; if etcd
// compacted that history, the name is invalidated and watched from the
// oldest revision left.
func (d *Directory) watch(name, key string, rev int64) {
	defer d.wg.Done()
	ctx := clientv3.WithRequireLeader(d.ctx)
	backoff := minBackoff
	for d.ctx.Err() == nil {
		wctx, wcancel := context.WithCancel(ctx)
		wch := d.cli.Watch(wctx, key, clientv3.WithRev(rev))
		for wr := range wch {
			if wr.CompactRevision != 0 {
				rev = wr.CompactRevision
				d.record(name, nil, rev)
				d.fire(name)
				break
			}
			if wr.Err() != nil {
				break
			}
			backoff = minBackoff
			for _, ev := range wr.Events {
				var desc *wire.SegmentDesc
				if ev.Type == mvccpb.PUT {
					desc, _ = decode(name, key, ev.Kv.Value)
				}
				d.record(name, desc, ev.Kv.ModRevision)
				rev = ev.Kv.ModRevision + 1
				d.fire(name)
			}
		}
		wcancel()
		select {
		case <-d.ctx.Done():
		case <-time.After(backoff):
			backoff = min(backoff*2, maxBackoff)
		}
	}
}

func (d *Directory) fire(name string) {
	d.invalidated.Add(1)
	d.invalidate(name)
}
