package memory_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/memory"
	"github.com/tent-dev/tent/memory/host"
)

// claims is a kind that claims the addresses in [lo, hi).
type claims struct {
	name   string
	lo, hi uint64
	err    error
}

func (c claims) Name() string          { return c.name }
func (c claims) CheckDevice(int) error { return nil }
func (c claims) Detect(addr uint64) (int, bool, error) {
	return 3, addr >= c.lo && addr < c.hi, c.err
}
func (c claims) Alloc(uint64, int) (*memory.Allocation, error) { return nil, nil }
func (c claims) CopyOut([]byte, uint64) error                  { return nil }
func (c claims) CopyIn(uint64, []byte) error                   { return nil }

func TestLayer(t *testing.T) {
	_, err := memory.NewLayer(claims{name: "gpu"})
	require.ErrorContains(t, err, "no host memory kind")
	_, err = memory.NewLayer(host.New(), claims{name: "gpu"}, claims{name: "gpu"})
	require.ErrorContains(t, err, `"gpu" given twice`)
	_, err = memory.NewLayer(host.New(), host.New())
	require.ErrorContains(t, err, `"cpu" given twice`)
	_, err = memory.NewLayer(host.New(), nil)
	require.Error(t, err)

	l, err := memory.NewLayer(host.New(), claims{name: "gpu", lo: 100, hi: 200})
	require.NoError(t, err)
	require.Equal(t, []string{"gpu", "cpu"}, l.Names(), "host last: it claims what the others do not")
	require.True(t, l.Has("gpu"))
	require.False(t, l.Has("tpu"))
	require.Nil(t, l.Kind("tpu"))
	require.Equal(t, "cpu", l.Host().Name())

	k, dev, err := l.Detect(150)
	require.NoError(t, err)
	require.Equal(t, "gpu", k.Name())
	require.Equal(t, 3, dev)
	k, dev, err = l.Detect(250)
	require.NoError(t, err)
	require.Equal(t, "cpu", k.Name())
	require.Equal(t, -1, dev)

	broken, err := memory.NewLayer(host.New(), claims{name: "gpu", err: errTest})
	require.NoError(t, err)
	k, _, err = broken.Detect(1)
	require.ErrorIs(t, err, errTest, "a kind that cannot tell is not overruled by host memory")
	require.Equal(t, "gpu", k.Name())
}

var errTest = errorString("cannot tell")

type errorString string

func (e errorString) Error() string { return string(e) }
