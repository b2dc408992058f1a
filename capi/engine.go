package main

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/json"
	"math"
	"runtime/debug"
	"strings"
	"time"
	"unsafe"

	"github.com/tent-dev/tent/capi/internal/handles"
	"github.com/tent-dev/tent/core"
	cumem "github.com/tent-dev/tent/memory/cuda"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Bounds on options that would otherwise be accepted and misbehave later.
const (
	maxSecretLen  = 4096
	maxTCPStreams = 1024
)

// cEngineOptions mirrors tent_engine_options with addresses as integers.
type cEngineOptions struct {
	size, reserved0                                        uint32
	name, listenAddr, metadata, metadataPrefix, transports uintptr
	secret                                                 uintptr
	secretLen                                              uint64
	timeoutMs, unregisterTimeoutMs                         uint64
	tcpStreams, reserved1                                  uint32
}

// The mirror must match the C layout exactly (-(a^b) overflows unless a == b).
const (
	_ = -(unsafe.Sizeof(cEngineOptions{}) ^ C.sizeof_tent_engine_options)
	_ = -(unsafe.Offsetof(cEngineOptions{}.secretLen) ^ unsafe.Offsetof(C.tent_engine_options{}.secret_len))
	_ = -(unsafe.Offsetof(cEngineOptions{}.tcpStreams) ^ unsafe.Offsetof(C.tent_engine_options{}.tcp_streams))
)

//export tentgo_engine_create
func tentgo_engine_create(opts C.uintptr_t, out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	if err := requireOut(uintptr(out), 8, "engine_out"); err != nil {
		return fail(err)
	}
	o, err := engineOptions(uintptr(opts))
	if err != nil {
		return fail(err)
	}
	o.Logger = logs.Logger()
	o.LocalPeers = lib.peers
	// GPU memory is the engine's when the process has a CUDA driver with
	// a GPU, whichever transports it installs.
	if gpu, err := cumem.Open(); err == nil {
		o.Memory = append(o.Memory, gpu)
	} else {
		o.Logger.Debug("engine without GPU memory", "reason", err)
	}
	ce, err := core.New(o)
	if err != nil {
		return fail(err)
	}
	e := &engine{core: ce}
	id := lib.handles.Add(handles.Engine, 0, e)
	e.id.Store(id)
	if err := writeValue(uintptr(out), C.uint64_t(id), "engine_out"); err != nil {
		_, _ = lib.handles.Remove(handles.Engine, id)
		_ = ce.Close()
		return fail(err)
	}
	return ok()
}

// engineOptions maps tent_engine_options at a to core.Options. 0 (NULL)
// means defaults. Strings and the secret are copied.
func engineOptions(a uintptr) (core.Options, error) {
	o := core.Options{Available: transportSpecs(0)}
	if a == 0 {
		return o, nil
	}
	p, err := readValue[cEngineOptions](a, "opts")
	if err != nil {
		return o, err
	}
	if err := checkStructSize(a, p.size, C.sizeof_tent_engine_options, "tent_engine_options", true); err != nil {
		return o, err
	}
	if p.reserved0 != 0 || p.reserved1 != 0 {
		return o, status.Errorf(status.InvalidArgument,
			"tent_engine_options: reserved0 and reserved1 must be 0 (got %d, %d)", p.reserved0, p.reserved1)
	}
	for _, f := range []struct {
		name string
		p    uintptr
		max  int
		dst  *string
	}{
		{"name", p.name, wire.MaxNameLen, &o.Name},
		{"listen_addr", p.listenAddr, maxStringLen, &o.ListenAddr},
		{"metadata", p.metadata, maxStringLen, &o.Metadata},
		{"metadata_prefix", p.metadataPrefix, maxStringLen, &o.MetadataPrefix},
	} {
		s, set, err := readText(f.p, f.max, "tent_engine_options."+f.name)
		if err != nil {
			return o, err
		}
		if set && s == "" {
			return o, status.Errorf(status.InvalidArgument, "tent_engine_options.%s is \"\": pass NULL for the default", f.name)
		}
		*f.dst = s
	}
	if m := o.Metadata; m != "" && m != "p2p" && (!strings.HasPrefix(m, "etcd://") || len(m) == len("etcd://")) {
		return o, status.Errorf(status.InvalidArgument,
			"tent_engine_options.metadata is %q: want NULL, \"p2p\" or \"etcd://host:port[,host:port...]\"", m)
	}
	ts, set, err := readString(p.transports, maxStringLen, "tent_engine_options.transports")
	if err != nil {
		return o, err
	}
	if set {
		names, err := splitTransports(ts)
		if err != nil {
			return o, err
		}
		o.Transports = names
	}
	switch {
	case p.secret == 0 && p.secretLen != 0:
		return o, status.Errorf(status.InvalidArgument, "tent_engine_options.secret is NULL but secret_len is %d", p.secretLen)
	case p.secret != 0 && p.secretLen == 0:
		return o, status.Errorf(status.InvalidArgument, "tent_engine_options.secret is set but secret_len is 0")
	case p.secretLen > maxSecretLen:
		return o, status.Errorf(status.InvalidArgument, "tent_engine_options.secret_len is %d, at most %d", p.secretLen, maxSecretLen)
	case p.secret != 0:
		if o.Secret, err = readBytes(p.secret, p.secretLen, "tent_engine_options.secret"); err != nil {
			return o, err
		}
	}
	if o.DefaultTimeout, err = millis(C.uint64_t(p.timeoutMs), "timeout_ms"); err != nil {
		return o, err
	}
	if o.UnregisterTimeout, err = millis(C.uint64_t(p.unregisterTimeoutMs), "unregister_timeout_ms"); err != nil {
		return o, err
	}
	if p.tcpStreams > maxTCPStreams {
		return o, status.Errorf(status.InvalidArgument, "tent_engine_options.tcp_streams is %d, at most %d", p.tcpStreams, maxTCPStreams)
	}
	o.Available = transportSpecs(p.tcpStreams)
	o.Directory = directoryFor(o.Metadata)
	return o, nil
}

// splitTransports parses "local, shm,tcp". Empty entries are errors rather
// than "no transport": NULL, not "", asks for all of them.
func splitTransports(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, status.Errorf(status.InvalidArgument,
			"tent_engine_options.transports is empty: pass NULL for all available transports")
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
		if parts[i] == "" {
			return nil, status.Errorf(status.InvalidArgument,
				"tent_engine_options.transports %q has an empty entry", s)
		}
	}
	return parts, nil
}

// millis converts a millisecond option; 0 stays 0 (the core's default).
func millis(ms C.uint64_t, what string) (time.Duration, error) {
	if uint64(ms) > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return 0, status.Errorf(status.InvalidArgument, "tent_engine_options.%s is %d: too large", what, uint64(ms))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

//export tentgo_engine_destroy
func tentgo_engine_destroy(id C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	// Removing first makes concurrent destroys race for one winner and
	// fails every later call on this handle with INVALID_HANDLE.
	v, err := lib.handles.Remove(handles.Engine, uint64(id))
	if err != nil {
		return fail(err)
	}
	e := v.(*engine)
	e.destroyed.Store(true)
	// Regions need nothing beyond removing their handles: Close drops them.
	// Children that hold more (batches, segments) are released here too.
	lib.handles.RemoveChildren(uint64(id))
	// The engine is gone from C's view whatever Close says: report its
	// error, but the handle stays invalid.
	if err := e.core.Close(); err != nil {
		return fail(err)
	}
	return ok()
}

//export tentgo_engine_name
func tentgo_engine_name(id C.uint64_t, buf C.uintptr_t, capacity C.size_t, lenOut C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if err := copyOut(uintptr(buf), capacity, uintptr(lenOut), e.segmentName()); err != nil {
		return fail(err)
	}
	return ok()
}

// segmentName is what peers pass to tent_segment_open: the options' name,
// else the listener's "host:port".
func (e *engine) segmentName() string { return e.core.Name() }

//export tentgo_uninstall
func tentgo_uninstall(id C.uint64_t, name C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	n, set, err := readString(uintptr(name), maxStringLen, "transport_name")
	if err != nil {
		return fail(err)
	}
	if set && n == "" {
		// core.Uninstall("") means all; in C only NULL does.
		return fail(status.Errorf(status.NotFound, "transport \"\" is not installed (pass NULL to uninstall all)"))
	}
	if err := e.core.Uninstall(n); err != nil {
		return fail(err)
	}
	return ok()
}

// engineStats is tent_stats, and the JSON of tent_engine_stats_json.
type engineStats struct {
	Regions          uint64 `json:"regions"`
	RegisteredBytes  uint64 `json:"registered_bytes"`
	Reservations     uint64 `json:"reservations"`
	Handles          uint64 `json:"handles"`
	Segments         uint64 `json:"segments"`
	Batches          uint64 `json:"batches"`
	RequestsInFlight uint64 `json:"requests_in_flight"`
	Allocations      uint64 `json:"allocations"`
	ProcessHandles   uint64 `json:"process_handles"`
	// NotifySenderRefused counts notifications refused for naming a
	// sender other than their connection's.
	NotifySenderRefused uint64 `json:"notify_sender_refused"`
	// Transports maps each installed transport to its resource counts.
	Transports map[string]map[string]int64 `json:"transports"`
	// Metadata is the metadata directory's counters (etcd only).
	Metadata map[string]int64 `json:"metadata,omitempty"`
	// Listeners maps each listener ("engine", and the transports that run
	// one) to its accept loop's counts.
	Listeners map[string]core.ListenerStats `json:"listeners"`
	// Unavailable maps each transport asked for that cannot serve on this
	// machine to the reason; those are not in Transports.
	Unavailable map[string]string `json:"unavailable"`
}

// stats gathers the engine's counts.
func (e *engine) stats() engineStats {
	cs := e.core.Stats()
	s := engineStats{
		Regions:             uint64(cs.Regions),
		RegisteredBytes:     cs.RegisteredBytes,
		Reservations:        uint64(cs.Reservations),
		Handles:             uint64(lib.handles.CountChildren(e.id.Load())),
		Segments:            uint64(cs.Segments),
		Batches:             uint64(cs.Batches),
		RequestsInFlight:    uint64(max(cs.RequestsInFlight, 0)),
		Allocations:         uint64(cs.Allocations),
		ProcessHandles:      uint64(lib.handles.Len()),
		NotifySenderRefused: uint64(max(cs.NotifySenderRefused, 0)),
		Transports:          cs.Transports,
		Metadata:            cs.Metadata,
		Listeners:           cs.Listeners,
		Unavailable:         cs.Unavailable,
	}
	if s.Listeners == nil {
		s.Listeners = map[string]core.ListenerStats{}
	}
	if s.Unavailable == nil {
		s.Unavailable = map[string]string{}
	}
	if s.Transports == nil {
		s.Transports = map[string]map[string]int64{}
	}
	for name, counts := range s.Transports {
		if counts == nil {
			s.Transports[name] = map[string]int64{}
		}
	}
	return s
}

//export tentgo_engine_stats
func tentgo_engine_stats(id C.uint64_t, out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if out == 0 {
		return fail(errNull("out"))
	}
	size, err := readValue[C.uint32_t](uintptr(out), "out")
	if err != nil {
		return fail(err)
	}
	if err := checkStructSize(uintptr(out), uint32(size), C.sizeof_tent_stats, "tent_stats", false); err != nil {
		return fail(err)
	}
	s := e.stats()
	if err := writeStruct(uintptr(out), uint32(size), C.tent_stats{
		size:               size,
		regions:            C.uint64_t(s.Regions),
		registered_bytes:   C.uint64_t(s.RegisteredBytes),
		reservations:       C.uint64_t(s.Reservations),
		handles:            C.uint64_t(s.Handles),
		segments:           C.uint64_t(s.Segments),
		batches:            C.uint64_t(s.Batches),
		requests_in_flight: C.uint64_t(s.RequestsInFlight),
		allocations:        C.uint64_t(s.Allocations),
		process_handles:    C.uint64_t(s.ProcessHandles),
	}, "out"); err != nil {
		return fail(err)
	}
	return ok()
}

//export tentgo_engine_stats_json
func tentgo_engine_stats_json(id C.uint64_t, buf C.uintptr_t, capacity C.size_t, lenOut C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	js, err := json.Marshal(e.stats())
	if err != nil {
		return fail(status.Errorf(status.Internal, "encoding stats: %w", err))
	}
	if err := copyOut(uintptr(buf), capacity, uintptr(lenOut), string(js)); err != nil {
		return fail(err)
	}
	return ok()
}
