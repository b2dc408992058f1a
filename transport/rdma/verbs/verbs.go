package verbs

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "loader.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// DefaultLibrary is the soname opened when Open is given no path.
const DefaultLibrary = "libibverbs.so.1"

// LibraryEnv names a path that Open uses instead of DefaultLibrary. Tests set
// it to the fake library, or to a missing file to see the "no library" path
// on a machine that has libibverbs installed.
const LibraryEnv = "TENT_RDMA_VERBS_LIBRARY"

// ErrNoDevice is what Devices returns when the library lists none.
var ErrNoDevice = errors.New("no RDMA device")

// ErrDestroyed is wrapped by every call on an object already destroyed
// (or whose library, context or PD is closed).
var ErrDestroyed = errors.New("already destroyed")

// ErrUnsupported is wrapped when the library lacks an optional entry point.
var ErrUnsupported = errors.ErrUnsupported

// Error is a failed verbs call: the call, the device, and the errno.
type Error struct {
	Call   string
	Device string
	Errno  syscall.Errno
}

func (e *Error) Error() string {
	dev := ""
	if e.Device != "" {
		dev = " on " + e.Device
	}
	return fmt.Sprintf("verbs: %s%s: %v (errno %d)", e.Call, dev, e.Errno, int(e.Errno))
}

func (e *Error) Unwrap() error { return e.Errno }

func callError(call, dev string, rc C.int) error {
	return &Error{Call: call, Device: dev, Errno: syscall.Errno(rc)}
}

func destroyed(call, what string) error {
	return fmt.Errorf("verbs: %s: %s %w", call, what, ErrDestroyed)
}

// Library is an opened libibverbs. It is safe for concurrent use.
type Library struct {
	mu       sync.Mutex
	lib      *C.tv_lib // C memory, so contexts may keep using it; nil after Close
	path     string
	contexts int
}

// Open dlopens path (LibraryEnv's value, else DefaultLibrary, when empty)
// and looks up the verbs entry points by version. The error carries the
// loader's reason (no such file, a missing symbol).
func Open(path string) (*Library, error) {
	if path == "" {
		path = LibraryPath(os.Getenv)
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	lib := (*C.tv_lib)(C.calloc(1, C.sizeof_tv_lib))
	if reason := C.tv_open(cpath, lib); reason != nil {
		C.free(unsafe.Pointer(lib))
		return nil, fmt.Errorf("%s: %s", path, C.GoString(reason))
	}
	return &Library{lib: lib, path: path}, nil
}

// LibraryPath is the library Open should be given: LibraryEnv's value when
// set, else DefaultLibrary.
func LibraryPath(getenv func(string) string) string {
	if p := getenv(LibraryEnv); p != "" {
		return p
	}
	return DefaultLibrary
}

// Path is the library's path as opened.
func (l *Library) Path() string { return l.path }

// HasDmabuf reports whether the library has ibv_reg_dmabuf_mr.
func (l *Library) HasDmabuf() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lib != nil && l.lib.reg_dmabuf_mr != nil
}

// Close dlcloses the library. It fails while contexts are open.
func (l *Library) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lib == nil {
		return destroyed("dlclose", "library")
	}
	if l.contexts > 0 {
		return fmt.Errorf("verbs: dlclose %s: %d device contexts still open", l.path, l.contexts)
	}
	C.tv_close(l.lib)
	C.free(unsafe.Pointer(l.lib))
	l.lib = nil
	return nil
}

// Device is one RDMA device the library lists.
type Device struct {
	Name       string
	GUID       uint64
	NUMANode   int    // -1 when unknown
	PCIAddress string // "" when unknown
}

const maxDevices = 64

// Devices lists the devices the library reports, or ErrNoDevice.
func (l *Library) Devices() ([]Device, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lib == nil {
		return nil, destroyed("ibv_get_device_list", "library")
	}
	infos := make([]C.tv_device_info, maxDevices)
	var n C.int
	if rc := C.tv_list_devices(l.lib, &infos[0], maxDevices, &n); rc != 0 {
		return nil, callError("ibv_get_device_list", "", rc)
	}
	if int(n) > maxDevices {
		n = maxDevices
	}
	devs := make([]Device, 0, int(n))
	for i := 0; i < int(n); i++ {
		sysfs := C.GoString(&infos[i].ibdev_path[0])
		devs = append(devs, Device{
			Name:       C.GoString(&infos[i].name[0]),
			GUID:       uint64(infos[i].guid),
			NUMANode:   numaNode(sysfs),
			PCIAddress: pciAddress(sysfs),
		})
	}
	if len(devs) == 0 {
		return nil, ErrNoDevice
	}
	return devs, nil
}

// numaNode reads <ibdev_path>/device/numa_node (-1 when absent).
func numaNode(ibdevPath string) int {
	if ibdevPath == "" {
		return -1
	}
	b, err := os.ReadFile(filepath.Join(ibdevPath, "device", "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// pciAddress is the name <ibdev_path>/device links to, e.g. 0000:3b:00.0.
func pciAddress(ibdevPath string) string {
	if ibdevPath == "" {
		return ""
	}
	target, err := filepath.EvalSymlinks(filepath.Join(ibdevPath, "device"))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

// Context is an opened device (ibv_context). Its PDs, MRs, CQs and QPs share
// its lock: structural calls take it exclusively, posting and polling shared.
type Context struct {
	lib      *Library
	name     string
	mu       sync.RWMutex
	ctx      *C.tv_context // nil after Close
	children int           // live PDs and CQs
}

// OpenDevice opens the named device.
func (l *Library) OpenDevice(name string) (*Context, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lib == nil {
		return nil, destroyed("ibv_open_device", "library")
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var ctx *C.tv_context
	if rc := C.tv_open_device(l.lib, cname, &ctx); rc != 0 {
		return nil, callError("ibv_open_device", name, rc)
	}
	l.contexts++
	return &Context{lib: l, name: name, ctx: ctx}, nil
}

// Name is the device's name.
func (c *Context) Name() string { return c.name }

// Close closes the device context. It fails while PDs or CQs are alive.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return destroyed("ibv_close_device", "context of "+c.name)
	}
	if c.children > 0 {
		return fmt.Errorf("verbs: ibv_close_device on %s: %d PDs and CQs still alive: %w", c.name, c.children, syscall.EBUSY)
	}
	if rc := C.tv_close_device(c.lib.lib, c.ctx); rc != 0 {
		return callError("ibv_close_device", c.name, rc)
	}
	c.ctx = nil
	c.lib.mu.Lock()
	c.lib.contexts--
	c.lib.mu.Unlock()
	return nil
}

// QueryPort reports a port's state, MTU, LID and link layer.
func (c *Context) QueryPort(port uint8) (PortAttr, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.ctx == nil {
		return PortAttr{}, destroyed("ibv_query_port", "context of "+c.name)
	}
	var a C.tv_port_attr
	if rc := C.tv_query_port(c.lib.lib, c.ctx, C.uint8_t(port), &a); rc != 0 {
		return PortAttr{}, callError("ibv_query_port", c.name, rc)
	}
	return PortAttr{
		State:     PortState(a.state),
		ActiveMTU: MTU(a.active_mtu),
		MaxMTU:    MTU(a.max_mtu),
		LID:       uint16(a.lid),
		LinkLayer: LinkLayer(a.link_layer),
		GIDTable:  int(a.gid_tbl_len),
	}, nil
}

// QueryGID reads entry index of a port's GID table.
func (c *Context) QueryGID(port uint8, index int) (GID, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.ctx == nil {
		return GID{}, destroyed("ibv_query_gid", "context of "+c.name)
	}
	var g C.tv_gid
	if rc := C.tv_query_gid(c.lib.lib, c.ctx, C.uint8_t(port), C.int(index), &g); rc != 0 {
		return GID{}, callError("ibv_query_gid", c.name, rc)
	}
	var out GID
	copy(out[:], C.GoBytes(unsafe.Pointer(&g), 16))
	return out, nil
}

// PD is a protection domain.
type PD struct {
	c        *Context
	pd       *C.tv_pd // nil after Dealloc
	children int      // live MRs and QPs
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return nil, destroyed("ibv_alloc_pd", "context of "+c.name)
	}
	var pd *C.tv_pd
	if rc := C.tv_alloc_pd(c.lib.lib, c.ctx, &pd); rc != 0 {
		return nil, callError("ibv_alloc_pd", c.name, rc)
	}
	c.children++
	return &PD{c: c, pd: pd}, nil
}

// Dealloc frees the PD. It fails while MRs or QPs of it are alive.
func (p *PD) Dealloc() error {
	c := p.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.pd == nil {
		return destroyed("ibv_dealloc_pd", "PD")
	}
	if p.children > 0 {
		return fmt.Errorf("verbs: ibv_dealloc_pd on %s: %d MRs and QPs still alive: %w", c.name, p.children, syscall.EBUSY)
	}
	if rc := C.tv_dealloc_pd(c.lib.lib, p.pd); rc != 0 {
		return callError("ibv_dealloc_pd", c.name, rc)
	}
	p.pd = nil
	c.children--
	return nil
}

// MR is a registered memory region.
type MR struct {
	pd         *PD
	mr         *C.tv_mr // nil after Dereg
	addr       uintptr
	length     uint64
	lkey, rkey uint32
}

// RegMR registers [addr, addr+length) with the given access.
func (p *PD) RegMR(addr uintptr, length uint64, access Access) (*MR, error) {
	c := p.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.pd == nil {
		return nil, destroyed("ibv_reg_mr", "PD")
	}
	var mr *C.tv_mr
	if rc := C.tv_reg_mr(c.lib.lib, p.pd, C.uintptr_t(addr), C.uint64_t(length), C.int(access), &mr); rc != 0 {
		return nil, callError("ibv_reg_mr", c.name, rc)
	}
	return p.adopt(mr, addr, length), nil
}

// RegDmabufMR registers length bytes at offset of a dmabuf (GPU memory),
// addressed by peers as iova. ErrUnsupported when the library lacks
// ibv_reg_dmabuf_mr.
func (p *PD) RegDmabufMR(offset, length uint64, iova uint64, fd int, access Access) (*MR, error) {
	c := p.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.pd == nil {
		return nil, destroyed("ibv_reg_dmabuf_mr", "PD")
	}
	if c.lib.lib.reg_dmabuf_mr == nil {
		return nil, fmt.Errorf("verbs: ibv_reg_dmabuf_mr: %s lacks it: %w", c.lib.path, ErrUnsupported)
	}
	var mr *C.tv_mr
	if rc := C.tv_reg_dmabuf_mr(c.lib.lib, p.pd, C.uint64_t(offset), C.uint64_t(length), C.uint64_t(iova), C.int(fd), C.int(access), &mr); rc != 0 {
		return nil, callError("ibv_reg_dmabuf_mr", c.name, rc)
	}
	return p.adopt(mr, uintptr(iova), length), nil
}

func (p *PD) adopt(mr *C.tv_mr, addr uintptr, length uint64) *MR {
	p.children++
	return &MR{pd: p, mr: mr, addr: addr, length: length, lkey: uint32(mr.lkey), rkey: uint32(mr.rkey)}
}

func (m *MR) LKey() uint32  { return m.lkey }
func (m *MR) RKey() uint32  { return m.rkey }
func (m *MR) Addr() uintptr { return m.addr }
func (m *MR) Len() uint64   { return m.length }

// Dereg deregisters the MR: once it returns, its rkey is refused.
func (m *MR) Dereg() error {
	c := m.pd.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.mr == nil {
		return destroyed("ibv_dereg_mr", "MR")
	}
	if rc := C.tv_dereg_mr(c.lib.lib, m.mr); rc != 0 {
		return callError("ibv_dereg_mr", c.name, rc)
	}
	m.mr = nil
	m.pd.children--
	return nil
}

// CQ is a completion queue.
type CQ struct {
	c     *Context
	cq    *C.tv_cq // nil after Destroy
	users int      // live QPs using it
	// pollMu guards wcs, the buffer Poll hands to the library.
	pollMu sync.Mutex
	wcs    []C.tv_wc
}

// CreateCQ creates a completion queue of at least entries entries.
func (c *Context) CreateCQ(entries int) (*CQ, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return nil, destroyed("ibv_create_cq", "context of "+c.name)
	}
	if entries <= 0 {
		return nil, callError("ibv_create_cq", c.name, C.int(syscall.EINVAL))
	}
	var cq *C.tv_cq
	if rc := C.tv_create_cq(c.lib.lib, c.ctx, C.int(entries), &cq); rc != 0 {
		return nil, callError("ibv_create_cq", c.name, rc)
	}
	c.children++
	return &CQ{c: c, cq: cq}, nil
}

// Destroy destroys the CQ. It fails while QPs use it.
func (q *CQ) Destroy() error {
	c := q.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if q.cq == nil {
		return destroyed("ibv_destroy_cq", "CQ")
	}
	if q.users > 0 {
		return fmt.Errorf("verbs: ibv_destroy_cq on %s: %d QPs still use it: %w", c.name, q.users, syscall.EBUSY)
	}
	if rc := C.tv_destroy_cq(c.lib.lib, q.cq); rc != 0 {
		return callError("ibv_destroy_cq", c.name, rc)
	}
	q.cq = nil
	c.children--
	return nil
}

// Poll takes up to len(out) completions without blocking.
func (q *CQ) Poll(out []Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	c := q.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	if q.cq == nil {
		return 0, destroyed("ibv_poll_cq", "CQ")
	}
	q.pollMu.Lock()
	defer q.pollMu.Unlock()
	if len(q.wcs) < len(out) {
		q.wcs = make([]C.tv_wc, len(out))
	}
	n := int(C.tv_poll_cq(q.cq, C.int(len(out)), &q.wcs[0]))
	if n < 0 {
		return 0, fmt.Errorf("verbs: ibv_poll_cq on %s: returned %d", c.name, n)
	}
	for i := 0; i < n; i++ {
		wc := &q.wcs[i]
		op := Op(0)
		switch wc.opcode {
		case C.TV_WC_RDMA_WRITE:
			op = OpWrite
		case C.TV_WC_RDMA_READ:
			op = OpRead
		}
		out[i] = Completion{ID: uint64(wc.wr_id), Status: WCStatus(wc.status), Op: op, Bytes: uint32(wc.byte_len), QPN: uint32(wc.qp_num)}
	}
	return n, nil
}

// QP is a reliable-connected queue pair.
type QP struct {
	pd         *PD
	send, recv *CQ
	qp         *C.tv_qp // nil after Destroy
	num        uint32
	port       uint8
	gidIndex   uint8
	caps       QPCaps
	// postMu guards the chain buffers PostSend fills.
	postMu   sync.Mutex
	flat     []C.tv_flat_wr
	chain    unsafe.Pointer // C memory: chainCap tv_send_wr then chainCap tv_sge
	chainCap int
}

// CreateRCQP creates an RC queue pair in the RESET state.
func (p *PD) CreateRCQP(send, recv *CQ, caps QPCaps) (*QP, error) {
	c := p.c
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case p.pd == nil:
		return nil, destroyed("ibv_create_qp", "PD")
	case send == nil || recv == nil || send.cq == nil || recv.cq == nil:
		return nil, destroyed("ibv_create_qp", "CQ")
	case send.c != c || recv.c != c:
		return nil, fmt.Errorf("verbs: ibv_create_qp on %s: a CQ of another device: %w", c.name, syscall.EINVAL)
	}
	cap := C.tv_qp_cap{
		max_send_wr: C.uint32_t(caps.MaxSendWR), max_recv_wr: C.uint32_t(caps.MaxRecvWR),
		max_send_sge: C.uint32_t(caps.MaxSendSGE), max_recv_sge: C.uint32_t(caps.MaxRecvSGE),
	}
	var qp *C.tv_qp
	if rc := C.tv_create_rc_qp(c.lib.lib, p.pd, send.cq, recv.cq, &cap, &qp); rc != 0 {
		return nil, callError("ibv_create_qp", c.name, rc)
	}
	p.children++
	send.users++
	recv.users++
	granted := QPCaps{MaxSendWR: int(cap.max_send_wr), MaxRecvWR: int(cap.max_recv_wr), MaxSendSGE: int(cap.max_send_sge), MaxRecvSGE: int(cap.max_recv_sge)}
	return &QP{pd: p, send: send, recv: recv, qp: qp, num: uint32(qp.qp_num), port: 1, caps: granted}, nil
}

// Num is the QP number peers address.
func (q *QP) Num() uint32 { return q.num }

// Caps is what the provider granted.
func (q *QP) Caps() QPCaps { return q.caps }

// SetSourceGIDIndex picks the local GID table entry ToRTR uses on a
// routed (RoCE) path; 0 by default. Call it before ToRTR.
func (q *QP) SetSourceGIDIndex(i uint8) { q.gidIndex = i }

func (q *QP) modify(call string, attr *C.tv_qp_attr, mask C.int) error {
	c := q.pd.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if q.qp == nil {
		return destroyed(call, "QP")
	}
	if rc := C.tv_modify_qp(c.lib.lib, q.qp, attr, mask); rc != 0 {
		return callError(call, c.name, rc)
	}
	return nil
}

// ToInit moves the QP from RESET to INIT on port, allowing peers the
// given remote access.
func (q *QP) ToInit(port uint8, access Access) error {
	var a C.tv_qp_attr
	a.qp_state = C.TV_QPS_INIT
	a.pkey_index = 0
	a.port_num = C.uint8_t(port)
	a.qp_access_flags = C.uint(access)
	if err := q.modify("ibv_modify_qp(INIT)", &a, C.TV_QP_STATE|C.TV_QP_PKEY_INDEX|C.TV_QP_PORT|C.TV_QP_ACCESS_FLAGS); err != nil {
		return err
	}
	q.port = port
	return nil
}

// ToRTR moves the QP from INIT to RTR, connected to remote.
func (q *QP) ToRTR(remote QPAddr, mtu MTU) error {
	var a C.tv_qp_attr
	a.qp_state = C.TV_QPS_RTR
	a.path_mtu = C.int(mtu)
	a.dest_qp_num = C.uint32_t(remote.QPN)
	a.rq_psn = C.uint32_t(remote.PSN & 0xffffff)
	a.max_dest_rd_atomic = 16
	a.min_rnr_timer = 12
	a.ah_attr.dlid = C.uint16_t(remote.LID)
	a.ah_attr.port_num = C.uint8_t(q.port)
	if !remote.GID.IsZero() {
		a.ah_attr.is_global = 1
		a.ah_attr.grh.hop_limit = 1
		a.ah_attr.grh.sgid_index = C.uint8_t(q.gidIndex)
		*(*GID)(unsafe.Pointer(&a.ah_attr.grh.dgid)) = remote.GID
	}
	return q.modify("ibv_modify_qp(RTR)", &a, C.TV_QP_STATE|C.TV_QP_AV|C.TV_QP_PATH_MTU|C.TV_QP_DEST_QPN|
		C.TV_QP_RQ_PSN|C.TV_QP_MAX_DEST_RD_ATOMIC|C.TV_QP_MIN_RNR_TIMER)
}

// ToRTS moves the QP from RTR to RTS with its first send PSN.
func (q *QP) ToRTS(psn uint32) error {
	var a C.tv_qp_attr
	a.qp_state = C.TV_QPS_RTS
	a.sq_psn = C.uint32_t(psn & 0xffffff)
	a.timeout = 14
	a.retry_cnt = 7
	a.rnr_retry = 7
	a.max_rd_atomic = 16
	return q.modify("ibv_modify_qp(RTS)", &a, C.TV_QP_STATE|C.TV_QP_SQ_PSN|C.TV_QP_TIMEOUT|C.TV_QP_RETRY_CNT|
		C.TV_QP_RNR_RETRY|C.TV_QP_MAX_QP_RD_ATOMIC)
}

// ToError moves the QP to the error state: posted work requests complete
// with WCWRFlushError.
func (q *QP) ToError() error {
	var a C.tv_qp_attr
	a.qp_state = C.TV_QPS_ERR
	return q.modify("ibv_modify_qp(ERR)", &a, C.TV_QP_STATE)
}

// PostSend chains wrs into one ibv_post_send (one doorbell). On failure the
// error names the index of the refused work request; those before it were
// posted.
func (q *QP) PostSend(wrs []SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	c := q.pd.c
	c.mu.RLock()
	defer c.mu.RUnlock()
	if q.qp == nil {
		return destroyed("ibv_post_send", "QP")
	}
	q.postMu.Lock()
	defer q.postMu.Unlock()
	if err := q.grow(len(wrs)); err != nil {
		return err
	}
	flat := q.flat[:len(wrs)]
	for i, wr := range wrs {
		var op C.int32_t
		switch wr.Op {
		case OpWrite:
			op = C.TV_WR_RDMA_WRITE
		case OpRead:
			op = C.TV_WR_RDMA_READ
		default:
			return fmt.Errorf("verbs: ibv_post_send on %s: work request %d: unknown op %v: %w", c.name, i, wr.Op, syscall.EINVAL)
		}
		signaled := C.int32_t(0)
		if wr.Signaled {
			signaled = 1
		}
		flat[i] = C.tv_flat_wr{id: C.uint64_t(wr.ID), local_addr: C.uint64_t(wr.LocalAddr), remote_addr: C.uint64_t(wr.RemoteAddr),
			length: C.uint32_t(wr.Length), lkey: C.uint32_t(wr.LKey), rkey: C.uint32_t(wr.RKey), opcode: op, signaled: signaled}
	}
	var bad C.int
	if rc := C.tv_post_send(q.qp, &flat[0], C.int(len(wrs)), q.chain, &bad); rc != 0 {
		return fmt.Errorf("%w (work request %d of %d)", callError("ibv_post_send", c.name, rc), int(bad), len(wrs))
	}
	return nil
}

func (q *QP) grow(n int) error {
	if n <= q.chainCap {
		return nil
	}
	size := C.size_t(n) * (C.sizeof_tv_send_wr + C.sizeof_tv_sge)
	buf := C.realloc(q.chain, size)
	if buf == nil {
		return fmt.Errorf("verbs: ibv_post_send: chain of %d: %w", n, syscall.ENOMEM)
	}
	q.chain, q.chainCap = buf, n
	q.flat = make([]C.tv_flat_wr, n)
	return nil
}

// Destroy destroys the QP (any state).
func (q *QP) Destroy() error {
	c := q.pd.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if q.qp == nil {
		return destroyed("ibv_destroy_qp", "QP")
	}
	if rc := C.tv_destroy_qp(c.lib.lib, q.qp); rc != 0 {
		return callError("ibv_destroy_qp", c.name, rc)
	}
	q.qp = nil
	q.pd.children--
	q.send.users--
	q.recv.users--
	q.postMu.Lock()
	C.free(q.chain)
	q.chain, q.chainCap, q.flat = nil, 0, nil
	q.postMu.Unlock()
	return nil
}

// Context is the device context the PD belongs to.
func (p *PD) Context() *Context { return p.c }
