// Package core is tent's engine: the registration index, the transport
// interface, segments and transfer batches. It knows nothing of C; package
// capi adapts it to the C ABI, and the transport packages plug into it.
//
// Core names no transport. Each declares itself in a TransportSpec (name,
// id, rank, channel kinds, constructor with its options bound in) that its
// package exports; the program building an engine lists the specs in
// Options.Available. The list is an engine option rather than a registry
// that packages fill from init, so that nothing an import does changes an
// engine, engines of one process can differ, and New can check the list
// (unique names, ids and channel kinds) and refuse a collision before any
// connection is routed by it.
//
// Registration is the heart of it. The index holds committed regions and
// in-flight reservations side by side, disjoint, ordered by address, so one
// O(log n) lookup answers "does [a, b) touch anything?". A registration:
//
//  1. reserves its whole interval set under the engine lock (all or nothing,
//     overlaps inside the batch included);
//  2. calls every installed transport with the lock released;
//  3. commits under the lock, or on the first failure unregisters from the
//     transports that already succeeded, in reverse order, and releases the
//     reservation. Step 3's rollback is a deferred guard, so a transport
//     that panics cannot leak a reservation.
//
// Lifetimes: an Engine owns its regions, transports, segments and batches;
// Close releases all of them. A Region stays valid for transfers until it is
// unregistered; unregistering waits (up to Options.UnregisterTimeout) for
// transfers that use it, then fails with ErrBusy and leaves it registered.
package core
