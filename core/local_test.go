package core_test

import (
	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/memory"
	"github.com/tent-dev/tent/transport/local"
)

func localTransport() core.Transport { return local.New() }

func uintptrOf(b []byte) uintptr { return uintptr(memoryAddr(b)) }

func memoryAddr(b []byte) uint64 { return memory.Addr(b) }
