package rdma

import "github.com/tent-dev/tent/transport/rdma/verbs"

// The values the transport exchanges with a NIC are the verbs binding's
// (libibverbs' own numbering), named here in the transport's words; the
// in-process fabric of the tests uses the same values.
type (
	access   = verbs.Access   // a set of ibv_access_flags
	opcode   = verbs.Op       // a one-sided operation
	wcStatus = verbs.WCStatus // an ibv_wc_status
	mtu      = verbs.MTU      // an ibv_mtu (1: 256 bytes … 5: 4096 bytes)
	gid      = verbs.GID      // a port's global identifier
)

const (
	accessLocalWrite  = verbs.AccessLocalWrite
	accessRemoteWrite = verbs.AccessRemoteWrite
	accessRemoteRead  = verbs.AccessRemoteRead

	opWrite = verbs.OpWrite
	opRead  = verbs.OpRead

	wcSuccess           = verbs.WCSuccess
	wcLocalProtError    = verbs.WCLocalProtError
	wcWRFlushError      = verbs.WCWRFlushError
	wcRemoteAccessError = verbs.WCRemoteAccessError
	wcRetryExceeded     = verbs.WCRetryExceeded
	wcGeneralError      = verbs.WCGeneralError

	mtu4096 = verbs.MTU4096
)

// portAttr is what the transport needs of a port.
type portAttr struct {
	ActiveMTU mtu
	LID       uint16
}

// qpAddr is what a peer needs to connect to a queue pair.
type qpAddr struct {
	QPN, PSN uint32
	LID      uint16
	GID      gid
	Port     uint8
}

// qpCaps sizes a queue pair's work queues.
type qpCaps struct{ MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE int }

// sendWR is one one-sided work request with one local buffer.
type sendWR struct {
	ID         uint64
	Op         opcode
	LocalAddr  uint64
	Length     uint32
	LKey       uint32
	RemoteAddr uint64
	RKey       uint32
	Signaled   bool
}

// completion is one work completion.
type completion struct {
	ID     uint64
	Status wcStatus
	Op     opcode
	Bytes  uint32
	QPN    uint32
}

// device is one device a library lists.
type device struct {
	Name       string
	NUMANode   int    // -1 unknown
	PCIAddress string // "" unknown
}
