package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	cu "github.com/tent-dev/tent/cuda"
)

// pattern fills b with the deterministic content of [off, off+len(b)) of
// a buffer with seed: splitmix64 of the word index, fast enough for GiBs.
func pattern(b []byte, seed, off uint64) {
	for i := 0; i+8 <= len(b); i += 8 {
		z := seed*0x9e3779b97f4a7c15 + (off+uint64(i))/8 + 1
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^(z>>31))
	}
}

// expected is the sha256 of [0, n) of the pattern with seed.
func expected(seed, n, step uint64) string {
	h := sha256.New()
	buf := make([]byte, min(step, n))
	for off := uint64(0); off < n; off += step {
		m := min(step, n-off)
		pattern(buf[:m], seed, off)
		h.Write(buf[:m])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// fill writes [0, n) of the pattern with seed into device memory at addr,
// through a host buffer.
func fill(d *cu.Driver, addr, n, seed, step uint64) error {
	buf := make([]byte, min(step, n))
	for off := uint64(0); off < n; off += step {
		m := min(step, n-off)
		pattern(buf[:m], seed, off)
		if err := d.CopyHtoD(addr+off, buf[:m]); err != nil {
			return err
		}
	}
	return nil
}

// sum is the sha256 of n bytes of device memory at addr, read through a
// host buffer.
func sum(d *cu.Driver, addr, n, step uint64) (string, error) {
	h := sha256.New()
	buf := make([]byte, min(step, n))
	for off := uint64(0); off < n; off += step {
		m := min(step, n-off)
		if err := d.CopyDtoH(buf[:m], addr+off); err != nil {
			return "", err
		}
		h.Write(buf[:m])
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hostSum is the sha256 of b.
func hostSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
