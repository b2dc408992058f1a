package core

// FlagNIC: RequestStatus.NIC and NICs are set: the request's bytes went
// through the NICs of a network transport (rdma), NIC being the index of
// the first of them (its first chunk's) and NICs how many carried parts
// of it. The index is the transport's own numbering, the one its stats
// name (nic.<device>.index).
const FlagNIC uint32 = 4

// MarkNIC records which local NICs carried r: the index of the first and
// how many did. A transport calls it before Done for a request it served;
// the fields show in r's status with FlagNIC.
func (r *Request) MarkNIC(first, count int) {
	r.nic.Store(uint32(uint16(first)) | uint32(uint16(count))<<16)
	r.flags.Or(FlagNIC)
}
