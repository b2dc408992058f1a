package core

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGroupBy(t *testing.T) {
	rs := make([]*Request, 7)
	for i := range rs {
		rs[i] = &Request{index: int32(i)}
	}
	keys := func(ks ...string) func(int) string { return func(i int) string { return ks[i] } }
	type want struct {
		key string
		idx []int
	}
	for _, tc := range []struct {
		name string
		rs   []*Request
		key  func(int) string
		want []want
	}{
		{"empty", nil, keys(), nil},
		{"one", rs[:1], keys("a"), []want{{"a", []int{0}}}},
		{"one key", rs, keys("a", "a", "a", "a", "a", "a", "a"), []want{{"a", []int{0, 1, 2, 3, 4, 5, 6}}}},
		{"interleaved", rs, keys("b", "a", "b", "c", "a", "b", "b"),
			[]want{{"b", []int{0, 2, 5, 6}}, {"a", []int{1, 4}}, {"c", []int{3}}}},
		{"last differs", rs[:3], keys("a", "a", "z"), []want{{"a", []int{0, 1}}, {"z", []int{2}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gs := groupBy(tc.rs, tc.key)
			require.Len(t, gs, len(tc.want))
			for g, w := range tc.want {
				require.Equal(t, w.key, gs[g].key)
				var idx []int
				for _, r := range gs[g].reqs {
					idx = append(idx, r.Index())
				}
				require.Equal(t, w.idx, idx)
			}
		})
	}
}
