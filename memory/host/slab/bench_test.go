//go:build unix

package slab

import "testing"

func benchSlab(b *testing.B) *Slab {
	s, err := New(256, 1024)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

func BenchmarkAllocFree(b *testing.B) {
	s := benchSlab(b)
	b.ReportAllocs()
	for range b.N {
		blk, err := s.Alloc()
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Free(blk); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocFreeBatch holds 64 blocks at a time, so the free list is
// deeper than one entry.
func BenchmarkAllocFreeBatch(b *testing.B) {
	s := benchSlab(b)
	var held [64]Block
	b.ReportAllocs()
	for range b.N {
		for i := range held {
			blk, err := s.Alloc()
			if err != nil {
				b.Fatal(err)
			}
			held[i] = blk
		}
		for _, blk := range held {
			if err := s.Free(blk); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(held)), "ns/block")
}

func BenchmarkAllocPtrFreePtr(b *testing.B) {
	s := benchSlab(b)
	b.ReportAllocs()
	for range b.N {
		blk, err := s.Alloc()
		if err != nil {
			b.Fatal(err)
		}
		if err := s.FreePtr(blk.Ptr()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAllocFreeParallel(b *testing.B) {
	s := benchSlab(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			blk, err := s.Alloc()
			if err != nil {
				b.Error(err)
				return
			}
			if err := s.Free(blk); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
