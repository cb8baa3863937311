package shm

import (
	"math/rand/v2"
	"testing"

	"github.com/shmsteer/shmsteer/internal/shmlayout"
)

// keyHashAgrees checks the generated reader's hash of key, placed at every alignment of a
// buffer, against the layout's reference (internal/shmlayout.RefKeyHash).
func keyHashAgrees(t *testing.T, seed, k1, k2 uint64, key []byte) {
	t.Helper()
	want := shmlayout.RefKeyHash(seed, k1, k2, key)
	buf := make([]byte, len(key)+8)
	for shift := range 8 {
		k := buf[shift : shift+len(key)]
		copy(k, key)
		if got := keyHashFrom(seed, k1, k2, k); got != want {
			t.Fatalf("len %d at offset %d: keyHashFrom %#x, reference %#x", len(key), shift, got, want)
		}
	}
}

// Every key length from 0 to MaxKeyLen, at every alignment, hashes as the reference does.
func TestKeyHashReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := make([]byte, MaxKeyLen)
	for i := range key {
		key[i] = byte(rng.Uint32())
	}
	for n := 0; n <= MaxKeyLen; n++ {
		keyHashAgrees(t, rng.Uint64(), rng.Uint64(), rng.Uint64(), key[:n])
	}
}

// FuzzKeyHash: arbitrary secrets and keys (cut to MaxKeyLen) hash as the reference does.
func FuzzKeyHash(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint64(3), []byte("0c6a1f52-9e1b-4d3a-8b2e-61f0a4c2d9e7"))
	f.Add(uint64(0), uint64(0), uint64(0), []byte{})
	f.Add(^uint64(0), uint64(1)<<63, uint64(7), []byte("abc"))
	f.Fuzz(func(t *testing.T, seed, k1, k2 uint64, key []byte) {
		keyHashAgrees(t, seed, k1, k2, key[:min(len(key), MaxKeyLen)])
	})
}
