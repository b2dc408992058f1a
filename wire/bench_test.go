package wire

import (
	"bytes"
	"io"
	"testing"
)

func BenchmarkDescEncode1000(b *testing.B) {
	d := testDesc(1000)
	buf, err := d.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		buf, err = d.AppendBinary(buf[:0])
		if err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDescMarshal1000(b *testing.B) {
	d := testDesc(1000)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := d.MarshalBinary(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDescDecode1000(b *testing.B) {
	buf, err := testDesc(1000).MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := UnmarshalSegmentDesc(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFindRegion1000(b *testing.B) {
	d := testDesc(1000)
	r := d.Regions[617]
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, ok := d.FindRegion(r.Addr+8, 64); !ok {
			b.Fatal("not found")
		}
	}
}

func BenchmarkWriteFrame64(b *testing.B) {
	payload := make([]byte, 64)
	b.SetBytes(int64(FrameHeaderSize + len(payload)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := WriteFrame(io.Discard, 1, payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadFrame64(b *testing.B) {
	var frame bytes.Buffer
	if err := WriteFrame(&frame, 1, make([]byte, 64)); err != nil {
		b.Fatal(err)
	}
	r := bytes.NewReader(nil)
	buf := make([]byte, 256)
	b.SetBytes(int64(frame.Len()))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r.Reset(frame.Bytes())
		if _, _, err := ReadFrame(r, 1024, buf); err != nil {
			b.Fatal(err)
		}
	}
}
