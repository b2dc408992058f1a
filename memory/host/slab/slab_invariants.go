//go:build tentinvariants

package slab

import "bytes"

// invariants turns on poisoning of freed blocks.
const invariants = true

// poisonByte fills freed blocks. It is neither zero (fresh memory) nor a
// small integer, so a stray write of either shows.
const poisonByte = 0xDB

var poisonPage = bytes.Repeat([]byte{poisonByte}, 4096)

func poison(mem []byte) {
	for len(mem) > 0 {
		mem = mem[copy(mem, poisonPage):]
	}
}

// checkPoison returns the offset of the first byte that is not poison.
func checkPoison(mem []byte) (int, bool) {
	for base := 0; base < len(mem); base += len(poisonPage) {
		piece := mem[base:min(base+len(poisonPage), len(mem))]
		if bytes.Equal(piece, poisonPage[:len(piece)]) {
			continue
		}
		for i, c := range piece {
			if c != poisonByte {
				return base + i, false
			}
		}
	}
	return -1, true
}
