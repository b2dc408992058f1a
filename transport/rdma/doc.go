// Package rdma is tent's RDMA transport: one-sided RDMA WRITE and READ
// between registered memory of two engines, over reliable-connected queue
// pairs of the verbs NICs of both hosts. libibverbs is loaded at run time
// (package verbs); a machine without it, or without a device, gets no rdma
// transport and sees why in the engine's stats.
//
// The transport is declared by Spec and needs nothing from core beyond
// what every transport uses:
//
//   - registration: RegisterMemory registers each region on every NIC the
//     transport opened (all or nothing), with remote access exactly the
//     region's permissions; GPU memory as a dmabuf of the engine's GPU
//     memory kind, else by its device pointer (peer memory), else not at
//     all (tcp stages it); UnregisterMemory deregisters before it returns,
//     so the rkeys die with the registration;
//   - the descriptor: Attachments publishes, per region, each NIC's rkey
//     and which NICs are near the region's memory; Endpoints publishes the
//     engine's listener, where queue pairs are connected;
//   - connections: QP parameters are exchanged over the engine's
//     authenticated listener (channel kind KindConnect), one connection per
//     queue pair; the target keeps its queue pair exactly as long as that
//     connection lives;
//   - data: Submit chains small requests into one post per queue pair
//     (one work request in SignalEvery signalled) and
//     splits large ones across the queue pairs of the NICs of the memory's
//     affinity; pollers (one per NIC) complete requests, each naming the
//     NICs that carried it (core.Request.MarkNIC); a queue pair that
//     fails is moved to the error state, its requests fail (core retries
//     them once on the next transport), and it is rebuilt, with a new queue
//     pair number exchanged over a new connect connection, on next use;
//     work submitted during the rebuild waits for it.
//
// See docs/RDMA.md for the design and for what has been tested (the fake
// libibverbs in package fakeverbs; no real NIC).
package rdma
