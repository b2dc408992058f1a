package main

// The transports built into libtent.so; each registers itself with core,
// which orders them by preference (core.AvailableTransports).
import (
	_ "github.com/tent-dev/tent/transport/cuda"
	_ "github.com/tent-dev/tent/transport/local"
	_ "github.com/tent-dev/tent/transport/shm"
	_ "github.com/tent-dev/tent/transport/tcp"
)
