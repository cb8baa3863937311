package bench

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
)

// Key workload shared by every keys.* contender: per-request keys are
// 36-character UUID-like strings, values are 32 bytes, looked up round-robin.
const (
	numKeys   = 1024 // a power of two, so round-robin is a mask
	valueSize = 32
)

// benchKeys returns the deterministic key set: numKeys UUID-shaped strings
// (8-4-4-4-12 lowercase hex), the same in every process that asks.
func benchKeys() []string {
	r := rand.New(rand.NewPCG(6, 6))
	keys := make([]string, numKeys)
	for i := range keys {
		hi, lo := r.Uint64(), r.Uint64()
		h := fmt.Sprintf("%016x%016x", hi, lo)
		keys[i] = h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	}
	return keys
}

// keyValue returns the valueSize-byte value stored under key i.
func keyValue(i int) []byte {
	v := make([]byte, valueSize)
	for j := range v {
		v[j] = byte(i*31 + j)
	}
	return v
}

// sink keeps lookup results observable so the compiler cannot drop the
// lookups as dead code. Atomic, once per batch, because contenders may run
// batches at once.
var sink atomic.Uint32

// gomapOp is the in-process floor for a key read: one Go map lookup of a 36-byte string key
// (hash plus compare) and a copy of the 32-byte value, as a Get returns it. The ids looked up
// are separate allocations from the ids stored, as in a server where the id arrives with each
// request; with the very same strings the map's compare would short-cut on pointer equality
// and never read the key bytes.
func gomapOp() Op {
	stored, lookup := benchKeys(), benchKeys()
	m := make(map[string][]byte, len(stored))
	for i, k := range stored {
		m[k] = keyValue(i)
	}
	buf := make([]byte, 0, valueSize)
	pos := 0 // across batches and their chunks, so the keys are read in one sequence
	return sliceOp(func(n int) error {
		var acc byte
		for i := pos; i < pos+n; i++ {
			buf = append(buf[:0], m[lookup[i&(numKeys-1)]]...)
			acc ^= buf[i&(valueSize-1)]
		}
		pos += n
		sink.Store(uint32(acc))
		return nil
	})
}

func gomapSetup() (Op, func() error, error) { return gomapOp(), nil, nil }

// gomapChild is the built-in child role "bench.gomap": the Go map read from a
// child process. It exercises the child driver and is the no-sharing
// control of the 2-reader throughput (two processes each with a private map
// scale only as far as the machine's cores and caches allow).
func gomapChild([]string) (map[string]Op, func() error, error) {
	return map[string]Op{"get": gomapOp()}, nil, nil
}

// The cold key workload: coldNumKeys keys, looked up uniform at random, so almost every read
// misses the caches (the hot case's 1,024 keys fit in L2).
const coldNumKeys = 1 << 20

// coldKeys returns the deterministic cold key set: coldNumKeys UUID-shaped strings, the same in
// every process that asks (a different seed from benchKeys).
func coldKeys() []string {
	r := rand.New(rand.NewPCG(13, 13))
	keys := make([]string, coldNumKeys)
	const hexdigits = "0123456789abcdef"
	var b [36]byte
	for i := range keys {
		hi, lo := r.Uint64(), r.Uint64()
		for j, k := 0, 0; j < 36; j++ {
			if j == 8 || j == 13 || j == 18 || j == 23 {
				b[j] = '-'
				continue
			}
			x := hi
			if k >= 16 {
				x = lo
			}
			b[j] = hexdigits[(x>>(4*(k%16)))&15]
			k++
		}
		keys[i] = string(b[:])
	}
	return keys
}

// coldIndex advances the xorshift state and returns the next uniform index in [0,
// coldNumKeys). Both cold contenders draw their keys with it, so they pay the same few
// nanoseconds for the randomness. The state must start non-zero.
func coldIndex(state *uint64) int {
	x := *state
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	*state = x
	return int(x >> (64 - 20))
}

// gomapColdSetup is keys.get.cold.gomap_ns: a Go map of the coldNumKeys keys, read uniform at
// random with separately allocated ids, copying the value as a Get does.
func gomapColdSetup() (Op, func() error, error) {
	stored, lookup := coldKeys(), coldKeys()
	m := make(map[string][]byte, len(stored))
	for i, k := range stored {
		m[k] = keyValue(i)
	}
	stored = nil
	buf := make([]byte, 0, valueSize)
	state := uint64(0x9e3779b97f4a7c15)
	return sliceOp(func(n int) error {
		var acc byte
		for i := range n {
			buf = append(buf[:0], m[lookup[coldIndex(&state)]]...)
			acc ^= buf[i&(valueSize-1)]
		}
		sink.Store(uint32(acc))
		return nil
	}), nil, nil
}
