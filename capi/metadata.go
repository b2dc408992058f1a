package main

// The metadata backends built into libtent.so; each registers its URL
// scheme with core ("etcd://host:port[,host:port...]").
import (
	_ "github.com/tent-dev/tent/metadata/etcd"
)
