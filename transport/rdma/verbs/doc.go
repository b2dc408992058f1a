// Package verbs loads libibverbs at run time with dlopen and lists the RDMA
// devices it reports. Nothing links against libibverbs: a machine without it
// gets an error naming the reason, for the rdma transport to report as its
// unavailability (the transport itself is still to come). See docs/RDMA.md.
package verbs
