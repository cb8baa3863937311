package bench

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
)

// Key workload shared by every keys.* contender: per-request keys are
// 36-character UUID-like strings, values are 32 bytes, looked up round-robin.
const (
	NumKeys   = 1024 // a power of two, so round-robin is a mask
	ValueSize = 32
)

// Keys returns the deterministic key set: NumKeys UUID-shaped strings
// (8-4-4-4-12 lowercase hex), the same in every process that asks.
func Keys() []string {
	r := rand.New(rand.NewPCG(6, 6))
	keys := make([]string, NumKeys)
	for i := range keys {
		hi, lo := r.Uint64(), r.Uint64()
		h := fmt.Sprintf("%016x%016x", hi, lo)
		keys[i] = h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	}
	return keys
}

// Value returns the ValueSize-byte value stored under key i.
func Value(i int) []byte {
	v := make([]byte, ValueSize)
	for j := range v {
		v[j] = byte(i*31 + j)
	}
	return v
}

// sink keeps lookup results observable so the compiler cannot drop the
// lookups as dead code. Atomic, once per batch, because the 2-reader
// scaling contender may run two batches at once.
var sink atomic.Uint32

// gomapOp is the in-process floor for a key read: one Go map lookup of a 36-byte string key
// (hash plus compare) and a copy of the 32-byte value, as a Get returns it. The ids looked up
// are separate allocations from the ids stored, as in a server where the id arrives with each
// request; with the very same strings the map's compare would short-cut on pointer equality
// and never read the key bytes.
func gomapOp() Op {
	stored, lookup := Keys(), Keys()
	m := make(map[string][]byte, len(stored))
	for i, k := range stored {
		m[k] = Value(i)
	}
	buf := make([]byte, 0, ValueSize)
	return GoOp(func(n int) error {
		var acc byte
		for i := range n {
			buf = append(buf[:0], m[lookup[i&(NumKeys-1)]]...)
			acc ^= buf[i&(ValueSize-1)]
		}
		sink.Store(uint32(acc))
		return nil
	})
}

func gomapSetup() (Op, func() error, error) { return gomapOp(), nil, nil }

// gomapChild is the built-in child role "bench.gomap": the Go map read from a
// child process. It exercises the child driver and is the no-sharing
// reference for the 2-reader scaling definition (two processes each with a
// private map scale only as far as the machine's cores and caches allow).
func gomapChild([]string) (map[string]Op, func() error, error) {
	return map[string]Op{"get": gomapOp()}, nil, nil
}
