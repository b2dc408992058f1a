package wire

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tent-dev/tent/status"
)

// testDesc returns a valid descriptor with n regions, some with attachments.
func testDesc(n int) *SegmentDesc {
	d := &SegmentDesc{
		Name:        "127.0.0.1:4000",
		MachineID:   "machine-0f3a",
		PID:         4242,
		Incarnation: 0x1122334455667788,
		Generation:  7,
		Endpoints: []Endpoint{
			{Transport: "tcp", Addr: "127.0.0.1:4000"},
			{Transport: "shm", Addr: "@tent-1234-ab12"},
		},
	}
	addr := uint64(0x7f0000000000)
	for i := 0; i < n; i++ {
		r := RegionDesc{Addr: addr, Len: uint64(4096 * (i%7 + 1)), Perm: Perm(i%3 + 1), Location: "cpu"}
		if i%5 == 1 {
			r.Location = "cuda:1"
			r.AllocID = uint64(i + 1)
			r.Attachments = []Attachment{
				{Transport: "cuda", Data: bytes.Repeat([]byte{byte(i)}, 64)},
				{Transport: "shm", Data: []byte("memfd:tent")},
			}
		}
		d.Regions = append(d.Regions, r)
		addr += r.Len + uint64(i%2)*4096 // adjacent and separated regions
	}
	return d
}

func TestDescRoundTrip(t *testing.T) {
	long := strings.Repeat("n", MaxNameLen)
	for _, tc := range []struct {
		name string
		d    *SegmentDesc
	}{
		{"minimal", &SegmentDesc{Name: "x"}},
		{"no regions", testDesc(0)},
		{"one region", testDesc(1)},
		{"many regions", testDesc(5000)},
		{"limits", &SegmentDesc{
			Name: long, MachineID: long, PID: ^uint32(0), Incarnation: ^uint64(0), Generation: ^uint64(0),
			Endpoints: []Endpoint{{Transport: strings.Repeat("t", MaxTransportLen), Addr: long}},
			Regions: []RegionDesc{
				{Addr: 0, Len: 1, Perm: 0},
				{Addr: 1, Len: ^uint64(0) - 1, Perm: PermMask, Location: strings.Repeat("l", MaxLocationLen),
					AllocID: ^uint64(0), Attachments: func() []Attachment {
						a := make([]Attachment, MaxAttachments)
						for i := range a {
							a[i] = Attachment{Transport: "t", Data: make([]byte, MaxAttachmentLen)}
						}
						return a
					}()},
			},
		}},
		{"max endpoints", func() *SegmentDesc {
			d := &SegmentDesc{Name: "e"}
			for i := 0; i < MaxEndpoints; i++ {
				d.Endpoints = append(d.Endpoints, Endpoint{Transport: "tcp"})
			}
			return d
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.d.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, int(tc.d.encodedSize()), len(b), "size computed ahead must be exact")
			got, err := UnmarshalSegmentDesc(b)
			require.NoError(t, err)
			require.Equal(t, tc.d, got)

			// AppendBinary keeps what is already in the buffer.
			b2, err := tc.d.AppendBinary([]byte("prefix"))
			require.NoError(t, err)
			require.Equal(t, append([]byte("prefix"), b...), b2)
		})
	}
}

func TestDescDecodeDoesNotAlias(t *testing.T) {
	b, err := testDesc(3).MarshalBinary()
	require.NoError(t, err)
	d, err := UnmarshalSegmentDesc(b)
	require.NoError(t, err)
	for i := range b {
		b[i] = 0xee
	}
	require.Equal(t, testDesc(3), d)
}

func TestDescValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(d *SegmentDesc)
		msg    string
	}{
		{"empty name", func(d *SegmentDesc) { d.Name = "" }, "empty segment name"},
		{"long name", func(d *SegmentDesc) { d.Name = strings.Repeat("a", MaxNameLen+1) }, "segment name length 1025 exceeds limit 1024"},
		{"long machine id", func(d *SegmentDesc) { d.MachineID = strings.Repeat("a", MaxNameLen+1) }, "machine id length 1025"},
		{"too many endpoints", func(d *SegmentDesc) { d.Endpoints = make([]Endpoint, MaxEndpoints+1) }, "65 endpoints exceed limit 64"},
		{"empty endpoint transport", func(d *SegmentDesc) { d.Endpoints[1].Transport = "" }, "endpoint 1: empty transport"},
		{"long endpoint transport", func(d *SegmentDesc) { d.Endpoints[0].Transport = strings.Repeat("t", MaxTransportLen+1) }, "endpoint 0: transport length 65"},
		{"long endpoint address", func(d *SegmentDesc) { d.Endpoints[0].Addr = strings.Repeat("a", MaxNameLen+1) }, "endpoint 0: address length 1025"},
		{"zero length", func(d *SegmentDesc) { d.Regions[2].Len = 0 }, "region 2 at 0x7f0000004000: zero length"},
		{"overflow", func(d *SegmentDesc) { d.Regions[3].Addr = ^uint64(0) - 10; d.Regions[3].Len = 11 }, "region 3: address 0xfffffffffffffff5 + length 0xb overflows"},
		{"unknown perm", func(d *SegmentDesc) { d.Regions[1].Perm = 0x84 }, "region 1 at 0x7f0000001000: unknown permission bits 0x84"},
		{"long location", func(d *SegmentDesc) { d.Regions[0].Location = strings.Repeat("c", MaxLocationLen+1) }, "location length 65 exceeds limit 64"},
		{"unsorted", func(d *SegmentDesc) { d.Regions[3].Addr, d.Regions[4].Addr = d.Regions[4].Addr, d.Regions[3].Addr }, "region 4 at 0x7f0000007000: not sorted (previous region starts at 0x7f000000c000)"},
		{"overlap", func(d *SegmentDesc) { d.Regions[3].Addr-- }, "region 3 [0x7f0000006fff, 0x7f000000afff) overlaps region 2 [0x7f0000004000, 0x7f0000007000)"},
		{"duplicate", func(d *SegmentDesc) { d.Regions[1] = d.Regions[0] }, "region 1 [0x7f0000000000, 0x7f0000001000) overlaps region 0"},
		{"too many attachments", func(d *SegmentDesc) { d.Regions[1].Attachments = make([]Attachment, MaxAttachments+1) }, "region 1 at 0x7f0000001000: 9 attachments exceed limit 8"},
		{"empty attachment transport", func(d *SegmentDesc) { d.Regions[1].Attachments[1].Transport = "" }, "region 1 attachment 1: empty transport"},
		{"long attachment transport", func(d *SegmentDesc) { d.Regions[1].Attachments[0].Transport = strings.Repeat("t", MaxTransportLen+1) }, "region 1 attachment 0: transport length 65"},
		{"long attachment", func(d *SegmentDesc) { d.Regions[1].Attachments[0].Data = make([]byte, MaxAttachmentLen+1) }, "region 1 attachment 0: data length 4097 exceeds limit 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testDesc(8)
			tc.mutate(d)

			_, err := d.MarshalBinary()
			requireCode(t, err, status.InvalidArgument)
			require.Contains(t, err.Error(), tc.msg)
			requireCode(t, d.Validate(), status.InvalidArgument)

			// The same descriptor forged onto the wire is refused by the
			// decoder, as a protocol error.
			_, err = UnmarshalSegmentDesc(d.appendUnchecked(nil))
			requireCode(t, err, status.Protocol)
			require.Contains(t, err.Error(), "descriptor: ")
		})
	}
}

func TestDescEncodeSizeLimit(t *testing.T) {
	// Attachments share one backing array, so this costs little memory while
	// encoding to more than MaxDescriptorSize.
	data := make([]byte, MaxAttachmentLen)
	atts := make([]Attachment, MaxAttachments)
	for i := range atts {
		atts[i] = Attachment{Transport: "x", Data: data}
	}
	d := &SegmentDesc{Name: "big"}
	n := MaxDescriptorSize/(MaxAttachments*MaxAttachmentLen) + 1
	for i := 0; i < n; i++ {
		d.Regions = append(d.Regions, RegionDesc{Addr: uint64(i) << 20, Len: 1, Attachments: atts})
	}
	_, err := d.MarshalBinary()
	requireCode(t, err, status.InvalidArgument)
	require.Contains(t, err.Error(), "exceeds limit 67108864")
}

// header returns the encoding of a valid descriptor with no endpoints and
// no regions, cut just before the endpoint count.
func headerOnly(t *testing.T) []byte {
	b, err := (&SegmentDesc{Name: "n"}).MarshalBinary()
	require.NoError(t, err)
	return b[:len(b)-8]
}

func u32le(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func TestDescDecodeErrors(t *testing.T) {
	valid, err := testDesc(4).MarshalBinary()
	require.NoError(t, err)
	with := func(off int, b ...byte) []byte {
		out := append([]byte(nil), valid...)
		copy(out[off:], b)
		return out
	}
	hdr := headerOnly(t)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

	for _, tc := range []struct {
		name string
		in   []byte
		code status.Code
		msg  string
	}{
		{"empty", nil, status.Protocol, "descriptor: header: wire: truncated"},
		{"bad magic", with(0, 'X'), status.Protocol, `bad magic "XSEG", want "TSEG"`},
		{"json", []byte(`{"name":"x"}`), status.Protocol, "bad magic"},
		{"future version", with(4, 2, 0), status.VersionMismatch, "format version 2 not supported"},
		{"version zero", with(4, 0, 0), status.VersionMismatch, "format version 0"},
		{"flags", with(6, 1), status.Protocol, "unknown flags 0x1"},
		{"trailing byte", append(append([]byte(nil), valid...), 0), status.Protocol, "1 trailing bytes"},
		{"name too long", cat(valid[:8], u32le(MaxNameLen+1)), status.Protocol, "length 1025 at offset 8 exceeds limit 1024"},
		{"endpoints over limit", cat(hdr, u32le(MaxEndpoints+1), u32le(0)), status.Protocol, "endpoints: wire: count 65"},
		{"regions over limit", cat(hdr, u32le(0), u32le(MaxRegions+1)), status.Protocol, "regions: wire: count 1048577"},
		{"regions over bytes", cat(hdr, u32le(0), u32le(3), make([]byte, 2*minRegionSize)), status.Protocol, "count 3 at offset"},
		{"bad perm", cat(hdr, u32le(0), u32le(1), make([]byte, 8), []byte{1, 0, 0, 0, 0, 0, 0, 0, 4}, make([]byte, 16)), status.Protocol, "unknown permission bits 0x4"},
		{"attachments over limit", cat(hdr, u32le(0), u32le(1), make([]byte, 8), []byte{1, 0, 0, 0, 0, 0, 0, 0, 1}, make([]byte, 12), u32le(9), make([]byte, 200)), status.Protocol, "region 0: wire: count 9"},
		{"oversized input", make([]byte, MaxDescriptorSize+1), status.Protocol, "size 67108865 exceeds limit 67108864"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := UnmarshalSegmentDesc(tc.in)
			requireCode(t, err, tc.code)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestDescEveryTruncationFails(t *testing.T) {
	b, err := testDesc(12).MarshalBinary()
	require.NoError(t, err)
	for n := 0; n < len(b); n++ {
		d, err := UnmarshalSegmentDesc(b[:n])
		require.Nil(t, d, "prefix %d", n)
		requireCode(t, err, status.Protocol, "prefix %d of %d", n, len(b))
	}
}

func TestDescHugeCountFailsFast(t *testing.T) {
	hdr := headerOnly(t)
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"2^31 regions", append(append(append([]byte(nil), hdr...), u32le(0)...), u32le(1<<31)...)},
		{"max regions in small buffer", append(append(append([]byte(nil), hdr...), u32le(0)...), u32le(MaxRegions)...)},
		{"2^32-1 endpoints", append(append([]byte(nil), hdr...), u32le(^uint32(0))...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append(tc.in, make([]byte, 100)...)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := UnmarshalSegmentDesc(in)
			runtime.ReadMemStats(&after)
			requireCode(t, err, status.Protocol)
			require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<10), "decoder allocated for a count it cannot have")
		})
	}
}

func TestFindRegion(t *testing.T) {
	d := &SegmentDesc{Name: "s", Regions: []RegionDesc{
		{Addr: 0x1000, Len: 0x1000, Perm: PermRead},
		{Addr: 0x2000, Len: 0x1000, Perm: PermWrite}, // adjacent to the first
		{Addr: 0x8000, Len: 0x100},
		{Addr: ^uint64(0) - 0x100, Len: 0x100}, // ends at the last address
	}}
	require.NoError(t, d.Validate())
	for _, tc := range []struct {
		addr, n uint64
		want    int // region index, -1 for none
	}{
		{0x1000, 0x1000, 0},
		{0x1000, 1, 0},
		{0x1fff, 1, 0},
		{0x2000, 1, 1},
		{0x2800, 0x800, 1},
		{0x1800, 0x1000, -1}, // spans two regions: never allowed, even adjacent ones
		{0xfff, 2, -1},
		{0x0, 0x10, -1},
		{0x3000, 1, -1},
		{0x80ff, 1, 2},
		{0x80ff, 2, -1},
		{0x8000, 0, -1}, // empty range
		{^uint64(0) - 0x100, 0x100, 3},
		{^uint64(0) - 1, 1, 3},
		{^uint64(0), 1, -1}, // wraps to 0
		{^uint64(0) - 1, 2, -1},
		{0x1000, ^uint64(0), -1},
	} {
		r, ok := d.FindRegion(tc.addr, tc.n)
		if tc.want < 0 {
			require.False(t, ok, "[%#x, +%#x) found %+v", tc.addr, tc.n, r)
			continue
		}
		require.True(t, ok, "[%#x, +%#x)", tc.addr, tc.n)
		require.Equal(t, d.Regions[tc.want], r)
	}
	_, ok := (&SegmentDesc{}).FindRegion(0, 1)
	require.False(t, ok)
}

func TestFindRegionMany(t *testing.T) {
	d := testDesc(1000)
	for i, r := range d.Regions {
		got, ok := d.FindRegion(r.Addr, r.Len)
		require.True(t, ok, "region %d", i)
		require.Equal(t, r, got)
		require.Same(t, &d.Regions[i], d.RegionAt(r.Addr+r.Len/2, 1), "RegionAt points into the descriptor")
		_, ok = d.FindRegion(r.Addr+r.Len-1, 2)
		require.Nil(t, d.RegionAt(r.Addr+r.Len-1, 2))
		if i+1 < len(d.Regions) && d.Regions[i+1].Addr == r.End() {
			require.False(t, ok, "range across adjacent regions %d and %d", i, i+1)
		} else {
			require.False(t, ok, "range past region %d", i)
		}
	}
}

func TestDescString(t *testing.T) {
	require.Contains(t, testDesc(3).String(), `segment "127.0.0.1:4000"`)
}
