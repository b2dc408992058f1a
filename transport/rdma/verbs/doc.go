// Package verbs is tent's binding of libibverbs (rdma-core), loaded at run
// time with dlopen: devices, device contexts, protection domains, memory
// regions, completion queues and reliable-connected queue pairs, and the
// one-sided RDMA_WRITE/RDMA_READ data path (a chain of work requests per
// doorbell, non-blocking polling). Nothing links against libibverbs and no
// rdma-core header is needed to build: abi.h declares the part of the
// binary interface tent uses (including the context's function table that
// verbs.h's inline ibv_post_send and ibv_poll_cq call through), and a test
// checks it against the real verbs.h where libibverbs-dev is installed.
//
// Every failed call returns an *Error naming the verbs call, the device and
// the errno. Objects track their state: a second Destroy/Dereg/Close, or a
// call on a destroyed object, wraps ErrDestroyed and never reaches the
// library; a parent with live children (a context with PDs or CQs, a PD with
// MRs or QPs, a CQ used by QPs) refuses to go with EBUSY. Tests run against
// the fake library of package fakeverbs. See docs/RDMA.md.
package verbs
