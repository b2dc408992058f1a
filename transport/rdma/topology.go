package rdma

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tent-dev/tent/core"
)

// nicInfo is one NIC as the transport chooses among them.
type nicInfo struct {
	Name string
	NUMA int    // NUMA node of its PCI device; -1 unknown
	PCI  string // PCI address ("0000:3b:00.0"); "" unknown
}

// sysfsAffinity reads the NUMA node and PCI address of the verbs device dev
// under root (normally /sys): class/infiniband/<dev>/device links to the
// PCI device, whose numa_node holds the node (-1 when the platform has
// none). Anything missing reads as unknown.
func sysfsAffinity(root, dev string) (numa int, pci string) {
	if root == "" {
		root = "/sys"
	}
	devDir := filepath.Join(root, "class", "infiniband", dev, "device")
	numa = -1
	if b, err := os.ReadFile(filepath.Join(devDir, "numa_node")); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 {
			numa = n
		}
	}
	if target, err := filepath.EvalSymlinks(devDir); err == nil {
		if base := filepath.Base(target); looksLikePCI(base) {
			pci = base
		}
	}
	return numa, pci
}

// looksLikePCI reports whether s has the form dddd:bb:dd.f.
func looksLikePCI(s string) bool {
	parts := strings.Split(s, ":")
	if len(parts) != 3 || len(parts[0]) != 4 || len(parts[1]) != 2 {
		return false
	}
	dev, fn, ok := strings.Cut(parts[2], ".")
	return ok && len(dev) == 2 && len(fn) == 1
}

// numaOf is the NUMA node of host memory at loc (cpu:N), else -1: GPU
// memory's NIC affinity (its PCI switch) is not looked up yet, so every NIC
// serves it.
func numaOf(loc core.Location) int {
	if loc.IsCUDA() {
		return -1
	}
	return loc.Device
}

// nicsFor lists the indexes of the NICs to use for memory on NUMA node numa
// (-1: unknown): those on that node, else all of them. Requests stripe
// across the NICs listed, which all have the same affinity.
func nicsFor(nics []nicInfo, numa int) []int {
	var near, all []int
	for i, n := range nics {
		all = append(all, i)
		if numa >= 0 && n.NUMA == numa {
			near = append(near, i)
		}
	}
	if len(near) > 0 {
		return near
	}
	return all
}
