package core

import (
	"strconv"
	"strings"

	"github.com/tent-dev/tent/status"
)

// Location says where memory lives: host memory ("cpu", or "cpu:N" for NUMA
// node N) or GPU memory ("cuda:N").
type Location struct {
	Kind   string // "cpu" or "cuda"
	Device int    // NUMA node or GPU ordinal; -1 when unspecified
}

// IsCUDA reports whether l is GPU memory.
func (l Location) IsCUDA() bool { return l.Kind == "cuda" }

func (l Location) String() string {
	if l.Device < 0 {
		return l.Kind
	}
	return l.Kind + ":" + strconv.Itoa(l.Device)
}

// maxDevice bounds device numbers so a typo cannot ask for device 2^31.
const maxDevice = 1 << 16

// ParseLocation parses "cpu", "cpu:N", "cuda" or "cuda:N". The empty string
// is not accepted here: callers detect the location from the address instead.
func ParseLocation(s string) (Location, error) {
	kind, dev, hasDev := strings.Cut(s, ":")
	if kind != "cpu" && kind != "cuda" {
		return Location{}, status.Errorf(status.InvalidArgument,
			"invalid location %q: want \"cpu\", \"cpu:N\" or \"cuda:N\"", s)
	}
	loc := Location{Kind: kind, Device: -1}
	if hasDev {
		n, err := strconv.Atoi(dev)
		if err != nil || n < 0 || n >= maxDevice || dev != strconv.Itoa(n) {
			return Location{}, status.Errorf(status.InvalidArgument,
				"invalid location %q: device must be a number in [0, %d)", s, maxDevice)
		}
		loc.Device = n
	}
	if kind == "cuda" && loc.Device < 0 {
		loc.Device = 0
	}
	return loc, nil
}
