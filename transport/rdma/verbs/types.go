package verbs

import "fmt"

// Access is a set of ibv_access_flags.
type Access uint32

const (
	AccessLocalWrite  Access = 1 // IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite Access = 2 // IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead  Access = 4 // IBV_ACCESS_REMOTE_READ
)

// Op is the operation of a work request or a completion.
type Op int

const (
	OpWrite Op = iota + 1 // RDMA_WRITE
	OpRead                // RDMA_READ
)

func (o Op) String() string {
	switch o {
	case OpWrite:
		return "RDMA_WRITE"
	case OpRead:
		return "RDMA_READ"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// WCStatus is an ibv_wc_status.
type WCStatus int

const (
	WCSuccess            WCStatus = 0
	WCLocalLengthError   WCStatus = 1
	WCLocalQPOpError     WCStatus = 2
	WCLocalEECOpError    WCStatus = 3
	WCLocalProtError     WCStatus = 4
	WCWRFlushError       WCStatus = 5
	WCMWBindError        WCStatus = 6
	WCBadResponseError   WCStatus = 7
	WCLocalAccessError   WCStatus = 8
	WCRemoteInvReqError  WCStatus = 9
	WCRemoteAccessError  WCStatus = 10
	WCRemoteOpError      WCStatus = 11
	WCRetryExceeded      WCStatus = 12
	WCRNRRetryExceeded   WCStatus = 13
	WCLocalRDDViolError  WCStatus = 14
	WCRemoteInvRDReqErr  WCStatus = 15
	WCRemoteAbortError   WCStatus = 16
	WCInvEECNError       WCStatus = 17
	WCInvEECStateError   WCStatus = 18
	WCFatalError         WCStatus = 19
	WCResponseTimeout    WCStatus = 20
	WCGeneralError       WCStatus = 21
	WCTagMatchingError   WCStatus = 22
	WCTagMatchingRndvInc WCStatus = 23
)

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "work request flushed", "memory window bind error", "bad response",
	"local access error", "remote invalid request", "remote access error", "remote operation error",
	"transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation",
	"remote invalid RD request", "remote aborted", "invalid EE context number", "invalid EE context state",
	"fatal error", "response timeout", "general error", "tag matching error", "tag matching rendezvous incomplete",
}

func (s WCStatus) String() string {
	if s >= 0 && int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", int(s))
}

// MTU is an ibv_mtu (1: 256 bytes … 5: 4096 bytes).
type MTU int

const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes is the MTU's size in bytes (0 when invalid).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << int(m)
}

// PortState is an ibv_port_state.
type PortState int

const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

// LinkLayer is a port's link layer.
type LinkLayer int

const (
	LinkUnspecified LinkLayer = 0
	LinkInfiniBand  LinkLayer = 1
	LinkEthernet    LinkLayer = 2
)

// GID is a port's global identifier (an IPv6 address on RoCE).
type GID [16]byte

// IsZero reports whether the GID is unset (InfiniBand within a subnet
// addresses by LID alone).
func (g GID) IsZero() bool { return g == GID{} }

// PortAttr is what QueryPort reports.
type PortAttr struct {
	State     PortState
	ActiveMTU MTU
	MaxMTU    MTU
	LID       uint16
	LinkLayer LinkLayer
	GIDTable  int
}

// QPCaps sizes a queue pair's work queues.
type QPCaps struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE int
}

// QPAddr is what a peer needs to connect to a QP: its number and first
// packet sequence number, and the port's LID and GID.
type QPAddr struct {
	QPN, PSN uint32
	LID      uint16
	GID      GID
	Port     uint8
}

// SendWR is one one-sided work request with one local buffer.
type SendWR struct {
	ID         uint64
	Op         Op
	LocalAddr  uint64
	Length     uint32
	LKey       uint32
	RemoteAddr uint64
	RKey       uint32
	Signaled   bool
}

// Completion is one work completion from a CQ.
type Completion struct {
	ID     uint64
	Status WCStatus
	Op     Op
	Bytes  uint32
	QPN    uint32
}
