package logbuf

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConcurrentWritesAllKept(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				_, _ = b.Write([]byte("x\n"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 800, strings.Count(b.String(), "x\n"))
}
