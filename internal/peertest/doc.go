// Package peertest runs a tent engine in a separate process for tests:
// the test binary re-executes itself as the peer (see Main), which
// registers buffers with a known pattern and takes commands on stdin. Tests
// of the transports use it to move real bytes between real processes over
// real sockets, and to kill a peer mid-transfer.
package peertest
