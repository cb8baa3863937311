//go:build linux

package shm_test

import (
	"fmt"

	"github.com/shmsteer/shmsteer/shm"
)

// The owner creates a region and writes; a reader maps the same memory (here in the same
// process: a worker gets the files from ipc.Attach) and reads a consistent snapshot, lock-free.
func ExampleCreate() {
	const kind shm.Kind = 100 // kinds 0..31 belong to shmsteer's packages
	r, err := shm.Create(shm.Config{IndexSlots: 64, ArenaBytes: 1 << 16})
	if err != nil {
		panic(err)
	}
	defer r.Close()
	written, err := r.Put(kind, "greeting", []byte("hello")) // the region version it made
	if err != nil {
		panic(err)
	}

	rd, err := shm.Open(r.Files())
	if err != nil {
		panic(err)
	}
	defer rd.Close()
	snap, err := rd.Snapshot()
	if err != nil {
		panic(err)
	}
	defer snap.Close()
	v, version, err := snap.View(kind, "greeting")
	fmt.Println(string(v), version == written, err, rd.IsOwner())
	// Output: hello true <nil> false
}

// An update applies several writes as one version: a snapshot sees all of them or none.
func ExampleRegion_Update() {
	r, err := shm.Create(shm.Config{IndexSlots: 64, ArenaBytes: 1 << 16})
	if err != nil {
		panic(err)
	}
	defer r.Close()
	_, err = r.Update(func(tx *shm.Tx) error {
		if err := tx.Put(100, "a", []byte("1")); err != nil {
			return err
		}
		return tx.PutFloat32(100, "b", []float32{0.5, 2})
	})
	if err != nil {
		panic(err)
	}
	snap, err := r.Snapshot()
	if err != nil {
		panic(err)
	}
	defer snap.Close()
	b, _, _ := snap.ViewFloat32(100, "b")
	n, _ := snap.Len(100)
	fmt.Println(n, b)
	// Output: 2 [0.5 2]
}
