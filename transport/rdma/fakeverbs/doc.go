// Package fakeverbs is test support for the rdma packages: it builds a fake
// libibverbs.so.1 (csrc/fakeverbs.c, the libibverbs binary interface of
// transport/rdma/verbs/abi.h) whose devices, memory regions and RC queue
// pairs behave like a NIC's, moving bytes between processes with
// process_vm_readv/writev, and reads its live-object counters. The header of
// csrc/fakeverbs.c documents its environment: FAKEVERBS_DEVICES,
// FAKEVERBS_STATE, FAKEVERBS_FAIL, FAKEVERBS_LINK_LAYER, FAKEVERBS_SYSFS.
// Only tests import it.
package fakeverbs
