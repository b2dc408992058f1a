// Package etcd is tent's cluster metadata backend: engines publish their
// segment descriptors in etcd and find each other by name. It is one of
// core's Directory implementations, beside metadata/p2p; an engine uses it
// with
//
//	Options.Directory      = etcd.Open
//	Options.Metadata       = "etcd://host:port[,host:port...][?ttl=N&dial_timeout=D]"
//	Options.MetadataPrefix = "/tent"   (the default when empty)
//
// (tent_engine_options.metadata and .metadata_prefix in the C ABI). Several
// endpoints are members of one cluster; the client balances over them.
// ttl (default 10 s) is the lease TTL of the engine's entry. dial_timeout
// (default 5 s) or the engine's timeout (Options.DefaultTimeout,
// tent_engine_options.timeout_ms), whichever is shorter, is the etcd
// timeout: it bounds every wait for etcd on a caller's behalf — engine
// creation, and each registration's wait for its publication. Both take a
// Go duration ("1500ms") or a number of seconds ("2").
// Unknown parameters are refused. The connection is plaintext and
// unauthenticated.
//
// # Key layout
//
//	<prefix>/segments/<name>   the engine's descriptor, in the wire binary
//	                           encoding (wire.SegmentDesc.MarshalBinary),
//	                           attached to the engine's lease
//
// A trailing "/" of the prefix is ignored; "/" alone puts the keys at
// "/segments/<name>". Engines with different prefixes are in different
// namespaces. A descriptor whose encoding exceeds 1 MiB (etcd refuses
// requests over 1.5 MiB by default) is stored without its regions; peers
// get the full descriptor over the control link in any case.
//
// # Names
//
// At engine creation the backend connects and grants a lease (an
// unreachable etcd fails creation with TENT_ERR_TIMEOUT or
// TENT_ERR_TRANSPORT within the etcd timeout), then claims the name with
// compare-and-set transactions: the key is created only if it is absent
// (CreateRevision 0), or rewritten if it is already this engine's (its
// lease, or its incarnation). A key held by anyone else fails creation with TENT_ERR_NAME_IN_USE, naming the holder
// (pid, control address) and when its lease expires; nothing is
// overwritten. An engine that dies without closing therefore holds its
// name until its lease expires (up to ttl).
//
// # The publication contract
//
// When engine creation, a registration (Register, RegisterBatch, Alloc),
// an unregistration (Unregister, UnregisterBatch, Free) or a transport
// Install/Uninstall returns successfully, etcd holds this engine's
// descriptor at that generation or a newer one: a reader of
// <prefix>/segments/<name> sees the change with no waiting. So a target
// may register memory and hand its address to a peer at once, and an
// operator or a test may look at etcd right after the call.
//
// Writes are coalesced: one goroutine writes the newest descriptor, and a
// caller waits until a write that covers its generation is confirmed —
// the write in flight, if it already holds the caller's change, or the
// next one. A batch costs one write; a burst of concurrent registrations
// costs one or two. Each write is a transaction with a compare on the
// lease, so only the owner writes.
//
// A call waits for etcd at most the etcd timeout. If etcd does not
// confirm by then, the call still succeeds — the change is made locally,
// and peers that reach this engine over its control link (every peer that
// has its segment open) see it at once — and the publisher keeps
// retrying in the background. Meanwhile the directory is "behind": later
// calls do not wait (an etcd outage costs one timeout, not one per
// registration), and tent_engine_stats_json reports it under "metadata"
// ("behind": 1, "publish_timeouts", "published_generation"). The first
// confirmed write ends it, and calls wait for publication again. Failing
// the registration instead would stop a serving process from registering
// memory during a metadata blip although its peers could use it, and the
// change could not be rolled back cleanly anyway (peers were told).
//
// # Leases
//
// The client's KeepAlive renews the lease every ttl/3. If the lease is
// lost (it expired while etcd was unreachable, or an operator revoked it)
// or the key is deleted, the engine grants a new lease and claims its name
// again, retrying with backoff until etcd answers; if another engine took
// the name meanwhile, it keeps retrying and never overwrites that engine's
// entry. Until the new claim is confirmed, etcd is not known to hold the
// descriptor, so calls wait for that claim as for any other write.
//
// A clean Close deletes the key (if still this engine's) and revokes the
// lease at once, waiting at most 2 s for etcd; a killed engine's key
// disappears when its lease expires.
//
// # Resolving and watching
//
// Resolve reads <prefix>/segments/<name> within the caller's deadline and
// decodes it with wire.UnmarshalSegmentDesc: a malformed or oversized
// value is TENT_ERR_PROTOCOL (an unknown format version
// TENT_ERR_VERSION_MISMATCH), a descriptor naming another segment is
// TENT_ERR_PROTOCOL, a missing key is TENT_ERR_NOT_FOUND. The engine then
// connects to the descriptor's control endpoint and takes the
// authoritative descriptor from the peer itself.
//
// The first successful Resolve of a name starts a watch on its key from
// the revision read. Every change — a new generation (regions registered
// or unregistered), a new incarnation (the peer restarted under the same
// name), a deletion (the peer closed or its lease expired) — calls
// Engine.InvalidatePeer, so the next transfer to that peer refreshes the
// descriptor before using it, and transports see a new Peer.Epoch. A
// broken watch resumes from the last revision seen, so no change is
// missed; if etcd compacted that history the peer is invalidated and the
// watch resumes from the oldest revision left. Watches end with the
// engine.
//
// # When etcd is unreachable
//
//   - Established peers keep working: transfers use the cached descriptors
//     and the peers' control links and data connections, none of which
//     needs etcd. If such a peer must be refreshed meanwhile, Resolve
//     waits at most 1 s for etcd and then answers from the watched copy.
//   - A name never resolved before fails with TENT_ERR_TIMEOUT (or
//     TENT_ERR_TRANSPORT) within the caller's deadline, naming the etcd
//     endpoints.
//   - Engine creation fails within the etcd timeout.
//   - Registrations succeed after at most one etcd timeout (see the
//     publication contract) and are published when etcd answers.
//   - The engine's own entry stays while etcd keeps its lease. The client
//     tries to reconnect at least every 2 s; when etcd answers again it
//     resumes renewing; if the lease was given up
//     (no renewal within ttl) a new one is granted and the entry
//     rewritten under it, and the old lease is revoked. Watches resume
//     from where they stopped.
//
// Go client: go.etcd.io/etcd/client/v3 v3.5, which speaks to etcd 3.4 and
// 3.5 servers; its logging is disabled (a library must not write to its
// host's stderr).
package etcd
