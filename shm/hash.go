package shm

import (
	"encoding/binary"
	"math/bits"
)

// keyHash hashes (kind, key) for the index, keyed with the region's random 128-bit salt.
//
// The construction is a multiply-fold hash in the style of wyhash, the family the Go runtime
// itself uses to hash map keys (seeded per process) where AES is unavailable: each 16-byte
// chunk is xored with the secret and folded by a 64×64→128-bit multiply. Request ids arrive
// from the network, so the hash must be keyed: without the salt, which lives only in the
// mapping, an attacker cannot precompute ids that collide. Probes are bounded as well, so even
// a colliding set could only make inserts in one neighbourhood fail with ErrRegionFull; it can
// never make lookups slow. SipHash was measured first and cost more than the whole lookup
// budget; this costs a fraction of it (bench's keys.get figures).
func keyHash(k0, k1 uint64, kind Kind, key []byte) uint64 {
	return keyHashFrom(kindSeed(k0, k1, kind), k1, key)
}

// kindSeed is keyHash's first step, which depends only on the salt and the kind: the hot path
// looks it up in Region.seeds instead (one multiply less on its critical path).
func kindSeed(k0, k1 uint64, kind Kind) uint64 { return fold(k0^uint64(kind)^prime0, k1^prime1) }

// keyHashFrom is keyHash from kindSeed's result.
func keyHashFrom(seed, k1 uint64, key []byte) uint64 {
	n := uint64(len(key))
	for len(key) > 16 {
		seed = fold(binary.LittleEndian.Uint64(key)^k1^prime2, binary.LittleEndian.Uint64(key[8:])^seed)
		key = key[16:]
	}
	var a, b uint64
	switch {
	case len(key) >= 8:
		a = binary.LittleEndian.Uint64(key)
		b = binary.LittleEndian.Uint64(key[len(key)-8:])
	case len(key) >= 4:
		a = uint64(binary.LittleEndian.Uint32(key))
		b = uint64(binary.LittleEndian.Uint32(key[len(key)-4:]))
	case len(key) > 0:
		a = uint64(key[0])<<16 | uint64(key[len(key)/2])<<8 | uint64(key[len(key)-1])
	}
	return fold(k1^n^prime3, fold(a^k1^prime2, b^seed))
}

// The primes are the layout table's (internal/shmlayout): the C reader hashes with them too.

// fold multiplies to 128 bits and xors the halves: every input bit reaches the output.
func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}
