package rdma

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeSysfs lays out class/infiniband/<dev>/device as a link to a PCI
// device directory with a numa_node file, as the kernel does.
func fakeSysfs(t *testing.T, devs map[string][2]string) string {
	t.Helper()
	root := t.TempDir()
	for dev, v := range devs {
		pciDir := filepath.Join(root, "devices", "pci0000:00", v[0])
		require.NoError(t, os.MkdirAll(pciDir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pciDir, "numa_node"), []byte(v[1]+"\n"), 0o644))
		ib := filepath.Join(root, "class", "infiniband", dev)
		require.NoError(t, os.MkdirAll(ib, 0o755))
		require.NoError(t, os.Symlink(pciDir, filepath.Join(ib, "device")))
	}
	return root
}

func TestSysfsAffinity(t *testing.T) {
	root := fakeSysfs(t, map[string][2]string{
		"mlx5_0": {"0000:3b:00.0", "1"},
		"mlx5_1": {"0000:af:00.0", "-1"},
	})
	numa, pci := sysfsAffinity(root, "mlx5_0")
	require.Equal(t, 1, numa)
	require.Equal(t, "0000:3b:00.0", pci)
	numa, pci = sysfsAffinity(root, "mlx5_1")
	require.Equal(t, -1, numa, "a platform without NUMA reports -1")
	require.Equal(t, "0000:af:00.0", pci)
	numa, pci = sysfsAffinity(root, "absent")
	require.Equal(t, -1, numa)
	require.Empty(t, pci)
}

func TestNICsForPrefersSameNode(t *testing.T) {
	nics := []nicInfo{{Name: "a", NUMA: 0}, {Name: "b", NUMA: 1}, {Name: "c", NUMA: 0}, {Name: "d", NUMA: -1}}
	require.Equal(t, []int{0, 2}, nicsFor(nics, 0), "both NICs of node 0, to stripe across")
	require.Equal(t, []int{1}, nicsFor(nics, 1))
	require.Equal(t, []int{0, 1, 2, 3}, nicsFor(nics, 3), "no NIC on node 3: all of them")
	require.Equal(t, []int{0, 1, 2, 3}, nicsFor(nics, -1), "unknown node: all of them")
	require.Nil(t, nicsFor(nil, 0))
}
