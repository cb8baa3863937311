package shmlayout

import "math/big"

// RefKeyHash is the index hash (keyHashFrom in reader.go.in) as the layout specifies it, written
// a second way for the tests only: words assembled byte by byte, the 128-bit products by
// math/big. The hash fuzz targets hold the generated Go reader (shm) and the C reader (capi) to
// it over every key length and alignment. Nothing reads a region with it.
func RefKeyHash(seed, k1, k2 uint64, key []byte) uint64 {
	word := func(at, size int) uint64 { // little-endian
		var w uint64
		for i := size - 1; i >= 0; i-- {
			w = w<<8 | uint64(key[at+i])
		}
		return w
	}
	fold := func(a, b uint64) uint64 {
		p := new(big.Int).Mul(new(big.Int).SetUint64(a), new(big.Int).SetUint64(b))
		lo := new(big.Int).And(p, new(big.Int).SetUint64(^uint64(0))).Uint64()
		return new(big.Int).Rsh(p, 64).Uint64() ^ lo
	}
	n := len(key)
	x, y := seed, seed^k2
	p := 0
	for ; n-p > 32; p += 32 { // 32-byte blocks: a 16-byte chunk per lane
		x, y = fold(word(p, 8)^k1, word(p+8, 8)^x), fold(word(p+16, 8)^k2, word(p+24, 8)^y)
	}
	if n-p > 16 { // the first half of a last chunk of 17-32 bytes: lane x
		x = fold(word(p, 8)^k1, word(p+8, 8)^x)
		p += 16
	}
	var a, b uint64 // the last 0-16 bytes
	switch left := n - p; {
	case left >= 8:
		a, b = word(p, 8), word(n-8, 8)
	case left >= 4:
		a, b = word(p, 4), word(n-4, 4)
	case left > 0:
		a = uint64(key[p])<<16 | uint64(key[p+left/2])<<8 | uint64(key[n-1])
	}
	r := fold(x^a, y^b^uint64(n)) // the lanes' fold, then the final avalanche
	return fold(r^k1, r^k2)
}
