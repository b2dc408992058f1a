package main

import (
	"strings"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/metadata/etcd"
)

// directoryFor is the directory of the metadata URL tent_engine_options
// gives (checked before): etcd for "etcd://...", else nil, which is
// core's p2p default. A backend added to the library is added here.
func directoryFor(metadata string) core.DirectoryFactory {
	if strings.HasPrefix(metadata, "etcd://") {
		return etcd.Open
	}
	return nil
}
