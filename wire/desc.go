package wire

import (
	"fmt"
	"sort"

	"github.com/tent-dev/tent/status"
)

// Perm is the set of remote accesses a region allows.
type Perm uint8

const (
	PermRead  Perm = 1 << 0 // peers may read the region
	PermWrite Perm = 1 << 1 // peers may write the region

	// PermMask holds every bit this version knows. Unknown bits are rejected
	// rather than ignored: a bit we do not understand might be a restriction.
	PermMask = PermRead | PermWrite
)

// Descriptor format constants and limits. The limits bound what a peer can
// make us allocate and are part of the format: a descriptor that exceeds
// them is invalid on both sides.
const (
	DescMagic   = "TSEG"
	DescVersion = 1

	MaxNameLen        = 1024     // segment name, machine id, endpoint address
	MaxTransportLen   = 64       // transport names in endpoints and attachments
	MaxLocationLen    = 64       // region location ("cpu:0", "cuda:7")
	MaxEndpoints      = 64       // endpoints per segment
	MaxRegions        = 1 << 20  // regions per segment
	MaxAttachments    = 8        // attachments per region
	MaxAttachmentLen  = 4096     // opaque bytes per attachment
	MaxDescriptorSize = 64 << 20 // whole encoded descriptor
)

// Minimum encoded sizes, used to bound counts by the bytes left.
const (
	descHeaderSize    = 4 + 2 + 2
	minEndpointSize   = 4 + 4
	minAttachmentSize = 4 + 4
	minRegionSize     = 8 + 8 + 1 + 4 + 8 + 4
)

// ControlEndpoint is the Endpoint.Transport of the engine's own listener,
// where its control links (descriptors, change pushes, notifications) go.
const ControlEndpoint = "ctl"

// Endpoint is an address at which a segment's engine accepts connections of
// one transport.
type Endpoint struct {
	Transport string // "tcp", "shm", ...
	Addr      string // "127.0.0.1:4000", "@tent-1234-ab12"
}

// Attachment carries opaque per-transport data for a region, such as a CUDA
// fabric handle or a memfd name.
type Attachment struct {
	Transport string
	Data      []byte
}

// RegionDesc describes one registered region as peers see it.
type RegionDesc struct {
	Addr     uint64
	Len      uint64
	Perm     Perm
	Location string // "cpu", "cpu:0", "cuda:1"
	// AllocID is non-zero when the engine allocated the memory itself and
	// can share it (memfd, cuMemCreate).
	AllocID     uint64
	Attachments []Attachment
}

// End returns the first address past the region. Valid descriptors
// guarantee it does not overflow.
func (r *RegionDesc) End() uint64 { return r.Addr + r.Len }

// SegmentDesc is what an engine publishes about itself: who it is, where to
// reach it, and which memory peers may access.
type SegmentDesc struct {
	Name      string // segment name, e.g. "127.0.0.1:4000"
	MachineID string // same value means same host
	PID       uint32
	// Incarnation is random per engine start, so a restarted peer with the
	// same name is told apart from the one it replaced.
	Incarnation uint64
	// Generation bumps on every registration change.
	Generation uint64
	Endpoints  []Endpoint
	Regions    []RegionDesc // sorted by Addr, non-overlapping
}

// checker collects the first validation failure with the status code the
// caller wants: InvalidArgument for what we are about to send, Protocol for
// what a peer sent.
type checker struct {
	code status.Code
	err  error
}

func (c *checker) failf(format string, args ...any) {
	if c.err == nil {
		c.err = status.Errorf(c.code, "descriptor: "+format, args...)
	}
}

func (c *checker) header(d *SegmentDesc) {
	if d.Name == "" {
		c.failf("empty segment name")
	}
	if len(d.Name) > MaxNameLen {
		c.failf("segment name length %d exceeds limit %d", len(d.Name), MaxNameLen)
	}
	if len(d.MachineID) > MaxNameLen {
		c.failf("machine id length %d exceeds limit %d", len(d.MachineID), MaxNameLen)
	}
}

func (c *checker) endpoint(i int, ep *Endpoint) {
	switch {
	case ep.Transport == "":
		c.failf("endpoint %d: empty transport", i)
	case len(ep.Transport) > MaxTransportLen:
		c.failf("endpoint %d: transport length %d exceeds limit %d", i, len(ep.Transport), MaxTransportLen)
	case len(ep.Addr) > MaxNameLen:
		c.failf("endpoint %d: address length %d exceeds limit %d", i, len(ep.Addr), MaxNameLen)
	}
}

// region checks r, the i-th region; prev is the region before it or nil.
func (c *checker) region(i int, r, prev *RegionDesc) {
	switch {
	case r.Len == 0:
		c.failf("region %d at %#x: zero length", i, r.Addr)
	case r.Addr+r.Len < r.Addr:
		c.failf("region %d: address %#x + length %#x overflows", i, r.Addr, r.Len)
	case r.Perm&^PermMask != 0:
		c.failf("region %d at %#x: unknown permission bits %#x", i, r.Addr, uint8(r.Perm&^PermMask))
	case len(r.Location) > MaxLocationLen:
		c.failf("region %d at %#x: location length %d exceeds limit %d", i, r.Addr, len(r.Location), MaxLocationLen)
	case len(r.Attachments) > MaxAttachments:
		c.failf("region %d at %#x: %d attachments exceed limit %d", i, r.Addr, len(r.Attachments), MaxAttachments)
	case prev != nil && r.Addr < prev.Addr:
		c.failf("region %d at %#x: not sorted (previous region starts at %#x)", i, r.Addr, prev.Addr)
	case prev != nil && r.Addr < prev.End():
		c.failf("region %d [%#x, %#x) overlaps region %d [%#x, %#x)",
			i, r.Addr, r.End(), i-1, prev.Addr, prev.End())
	}
	for j := range r.Attachments {
		c.attachment(i, j, &r.Attachments[j])
	}
}

func (c *checker) attachment(i, j int, a *Attachment) {
	switch {
	case a.Transport == "":
		c.failf("region %d attachment %d: empty transport", i, j)
	case len(a.Transport) > MaxTransportLen:
		c.failf("region %d attachment %d: transport length %d exceeds limit %d", i, j, len(a.Transport), MaxTransportLen)
	case len(a.Data) > MaxAttachmentLen:
		c.failf("region %d attachment %d: data length %d exceeds limit %d", i, j, len(a.Data), MaxAttachmentLen)
	}
}

// Validate reports the first rule d breaks as an InvalidArgument error.
func (d *SegmentDesc) Validate() error {
	c := checker{code: status.InvalidArgument}
	d.validate(&c)
	return c.err
}

func (d *SegmentDesc) validate(c *checker) {
	c.header(d)
	if len(d.Endpoints) > MaxEndpoints {
		c.failf("%d endpoints exceed limit %d", len(d.Endpoints), MaxEndpoints)
	}
	if len(d.Regions) > MaxRegions {
		c.failf("%d regions exceed limit %d", len(d.Regions), MaxRegions)
	}
	for i := range d.Endpoints {
		c.endpoint(i, &d.Endpoints[i])
	}
	var prev *RegionDesc
	for i := range d.Regions {
		c.region(i, &d.Regions[i], prev)
		if c.err != nil {
			return
		}
		prev = &d.Regions[i]
	}
}

// encodedSize returns the exact encoded size of a validated descriptor.
func (d *SegmentDesc) encodedSize() uint64 {
	n := uint64(descHeaderSize) + 4 + uint64(len(d.Name)) + 4 + uint64(len(d.MachineID)) + 4 + 8 + 8
	n += 4
	for i := range d.Endpoints {
		n += minEndpointSize + uint64(len(d.Endpoints[i].Transport)+len(d.Endpoints[i].Addr))
	}
	n += 4
	for i := range d.Regions {
		r := &d.Regions[i]
		n += minRegionSize + uint64(len(r.Location))
		for j := range r.Attachments {
			n += minAttachmentSize + uint64(len(r.Attachments[j].Transport)+len(r.Attachments[j].Data))
		}
	}
	return n
}

// MarshalBinary validates d and encodes it.
func (d *SegmentDesc) MarshalBinary() ([]byte, error) {
	return d.AppendBinary(nil)
}

// AppendBinary validates d and appends its encoding to b.
func (d *SegmentDesc) AppendBinary(b []byte) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return b, err
	}
	size := d.encodedSize()
	if size > MaxDescriptorSize {
		return b, status.Errorf(status.InvalidArgument,
			"descriptor: encoded size %d exceeds limit %d", size, MaxDescriptorSize)
	}
	if free := cap(b) - len(b); uint64(free) < size {
		nb := make([]byte, len(b), uint64(len(b))+size)
		copy(nb, b)
		b = nb
	}
	return d.appendUnchecked(b), nil
}

// appendUnchecked encodes d without validating it; tests use it to forge
// invalid descriptors.
func (d *SegmentDesc) appendUnchecked(b []byte) []byte {
	e := NewEncoder(b)
	e.RawString(DescMagic)
	e.U16(DescVersion)
	e.U16(0) // flags
	e.String(d.Name)
	e.String(d.MachineID)
	e.U32(d.PID)
	e.U64(d.Incarnation)
	e.U64(d.Generation)
	e.U32(uint32(len(d.Endpoints)))
	for i := range d.Endpoints {
		e.String(d.Endpoints[i].Transport)
		e.String(d.Endpoints[i].Addr)
	}
	e.U32(uint32(len(d.Regions)))
	for i := range d.Regions {
		r := &d.Regions[i]
		e.U64(r.Addr)
		e.U64(r.Len)
		e.U8(uint8(r.Perm))
		e.String(r.Location)
		e.U64(r.AllocID)
		e.U32(uint32(len(r.Attachments)))
		for j := range r.Attachments {
			e.String(r.Attachments[j].Transport)
			e.Bytes(r.Attachments[j].Data)
		}
	}
	return e.Out()
}

// UnmarshalSegmentDesc decodes and validates a descriptor received from a
// peer. The result does not alias b. Every failure is a status.Protocol
// error, except an unknown format version, which is status.VersionMismatch.
func UnmarshalSegmentDesc(b []byte) (*SegmentDesc, error) {
	if len(b) > MaxDescriptorSize {
		return nil, status.Errorf(status.Protocol, "descriptor: size %d exceeds limit %d", len(b), MaxDescriptorSize)
	}
	dec := NewDecoder(b)
	magic := dec.Raw(len(DescMagic))
	version := dec.U16()
	flags := dec.U16()
	if err := dec.Err(); err != nil {
		return nil, status.Errorf(status.Protocol, "descriptor: header: %w", err)
	}
	if string(magic) != DescMagic {
		return nil, status.Errorf(status.Protocol, "descriptor: bad magic %q, want %q", magic, DescMagic)
	}
	if version != DescVersion {
		return nil, status.Errorf(status.VersionMismatch,
			"descriptor: format version %d not supported (this build reads version %d)", version, DescVersion)
	}
	if flags != 0 {
		return nil, status.Errorf(status.Protocol, "descriptor: unknown flags %#x", flags)
	}

	c := checker{code: status.Protocol}
	d := &SegmentDesc{}
	d.Name = dec.String(MaxNameLen)
	d.MachineID = dec.String(MaxNameLen)
	d.PID = dec.U32()
	d.Incarnation = dec.U64()
	d.Generation = dec.U64()
	if err := dec.Err(); err != nil {
		return nil, status.Errorf(status.Protocol, "descriptor: header: %w", err)
	}
	if c.header(d); c.err != nil {
		return nil, c.err
	}

	if n := dec.Count(MaxEndpoints, minEndpointSize); n > 0 {
		d.Endpoints = make([]Endpoint, n)
		for i := range d.Endpoints {
			ep := &d.Endpoints[i]
			ep.Transport = dec.String(MaxTransportLen)
			ep.Addr = dec.String(MaxNameLen)
			if err := dec.Err(); err != nil {
				return nil, status.Errorf(status.Protocol, "descriptor: endpoint %d: %w", i, err)
			}
			if c.endpoint(i, ep); c.err != nil {
				return nil, c.err
			}
		}
	}
	if err := dec.Err(); err != nil {
		return nil, status.Errorf(status.Protocol, "descriptor: endpoints: %w", err)
	}

	n := dec.Count(MaxRegions, minRegionSize)
	if err := dec.Err(); err != nil {
		return nil, status.Errorf(status.Protocol, "descriptor: regions: %w", err)
	}
	if n > 0 {
		d.Regions = make([]RegionDesc, n)
	}
	var al arena
	for i := range d.Regions {
		r := &d.Regions[i]
		r.Addr = dec.U64()
		r.Len = dec.U64()
		r.Perm = Perm(dec.U8())
		r.Location = al.str(dec.Bytes(MaxLocationLen))
		r.AllocID = dec.U64()
		if na := dec.Count(MaxAttachments, minAttachmentSize); na > 0 {
			r.Attachments = al.attachments(na, len(d.Regions)-i)
			for j := range r.Attachments {
				a := &r.Attachments[j]
				a.Transport = al.str(dec.Bytes(MaxTransportLen))
				a.Data = al.copyBytes(dec.Bytes(MaxAttachmentLen), dec.Remaining())
			}
		}
		if err := dec.Err(); err != nil {
			return nil, status.Errorf(status.Protocol, "descriptor: region %d: %w", i, err)
		}
		var prev *RegionDesc
		if i > 0 {
			prev = &d.Regions[i-1]
		}
		if c.region(i, r, prev); c.err != nil {
			return nil, c.err
		}
	}
	if err := dec.Finish(); err != nil {
		return nil, status.Errorf(status.Protocol, "descriptor: %w", err)
	}
	return d, nil
}

// FindRegion returns the region that wholly contains [addr, addr+n). It is
// how a remote range is checked before bytes move, so it refuses n == 0 and
// ranges that wrap around the address space. It assumes d is valid (sorted,
// non-overlapping), as every decoded descriptor is.
func (d *SegmentDesc) FindRegion(addr, n uint64) (RegionDesc, bool) {
	if r := d.RegionAt(addr, n); r != nil {
		return *r, true
	}
	return RegionDesc{}, false
}

// RegionAt is FindRegion without the copy: the region inside d.Regions, or
// nil. A descriptor is not changed once made, so the pointer stays valid
// and its region current for as long as the caller holds d.
func (d *SegmentDesc) RegionAt(addr, n uint64) *RegionDesc {
	if n == 0 || addr+n < addr {
		return nil
	}
	// First region starting after addr; the candidate is the one before it.
	i := sort.Search(len(d.Regions), func(i int) bool { return d.Regions[i].Addr > addr })
	if i == 0 {
		return nil
	}
	r := &d.Regions[i-1]
	if addr+n > r.Addr+r.Len {
		return nil
	}
	return r
}

// String summarises d for logs without dumping every region.
func (d *SegmentDesc) String() string {
	return fmt.Sprintf("segment %q (machine %q pid %d incarnation %#x generation %d, %d endpoints, %d regions)",
		d.Name, d.MachineID, d.PID, d.Incarnation, d.Generation, len(d.Endpoints), len(d.Regions))
}

// arena cuts down the allocations of a decode: the few distinct strings of
// a segment (locations, transport names) are interned, and attachments and
// their data are carved from shared chunks. Chunk sizes are bounded by what
// is left of the input, so a peer still cannot make us allocate for data it
// did not send. Carved slices have their capacity clipped, so appending to
// one never writes into its neighbour.
type arena struct {
	strs [8]string
	next int
	atts []Attachment
	data []byte
}

func (a *arena) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	for _, s := range a.strs {
		if s == string(b) {
			return s
		}
	}
	s := string(b)
	a.strs[a.next%len(a.strs)] = s
	a.next++
	return s
}

// attachments returns n zeroed attachments; regionsLeft (this one
// included) sizes the next chunk.
func (a *arena) attachments(n, regionsLeft int) []Attachment {
	if len(a.atts) < n {
		a.atts = make([]Attachment, max(n, min(regionsLeft*2, 256)))
	}
	out := a.atts[:n:n]
	a.atts = a.atts[n:]
	return out
}

// copyBytes copies b; left is the number of input bytes after b, which bounds
// how much more attachment data can follow.
func (a *arena) copyBytes(b []byte, left int) []byte {
	if len(b) == 0 {
		return nil
	}
	if len(a.data) < len(b) {
		a.data = make([]byte, len(b)+min(left, 16<<10))
	}
	out := a.data[:len(b):len(b)]
	a.data = a.data[len(b):]
	copy(out, b)
	return out
}
