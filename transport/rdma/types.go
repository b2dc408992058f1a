package rdma

import "fmt"

// The values the transport exchanges with a NIC, numbered as libibverbs
// numbers them (ibv_access_flags, ibv_wc_status, ibv_mtu), so the adapter
// to a verbs binding (device.go) converts by type alone.

// access is a set of ibv_access_flags.
type access uint32

const (
	accessLocalWrite  access = 1 // IBV_ACCESS_LOCAL_WRITE
	accessRemoteWrite access = 2 // IBV_ACCESS_REMOTE_WRITE
	accessRemoteRead  access = 4 // IBV_ACCESS_REMOTE_READ
)

// opcode is a one-sided operation.
type opcode int

const (
	opWrite opcode = 1 // RDMA_WRITE
	opRead  opcode = 2 // RDMA_READ
)

// wcStatus is an ibv_wc_status.
type wcStatus int

const (
	wcSuccess           wcStatus = 0
	wcLocalProtError    wcStatus = 4
	wcWRFlushError      wcStatus = 5
	wcRemoteAccessError wcStatus = 10
	wcRetryExceeded     wcStatus = 12
	wcGeneralError      wcStatus = 21
)

func (s wcStatus) String() string {
	switch s {
	case wcSuccess:
		return "success"
	case wcLocalProtError:
		return "local protection error"
	case wcWRFlushError:
		return "work request flushed"
	case wcRemoteAccessError:
		return "remote access error"
	case wcRetryExceeded:
		return "transport retry counter exceeded"
	case wcGeneralError:
		return "general error"
	}
	return fmt.Sprintf("ibv_wc_status %d", int(s))
}

// mtu is an ibv_mtu (1: 256 bytes … 5: 4096 bytes).
type mtu int

const mtu4096 mtu = 5

// gid is a port's global identifier.
type gid [16]byte

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
