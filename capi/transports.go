package main

// The transports built into libtent.so; each registers itself with core.
import (
	_ "github.com/tent-dev/tent/transport/local"
	_ "github.com/tent-dev/tent/transport/tcp"
)
