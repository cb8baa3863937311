package bench

import (
	"fmt"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
	"golang.org/x/sys/unix"
)

// The memory workload: the key registry's 1024 keys of 32 bytes, and 16 named steering sets of
// 8 layers × 2 hooks of 4096 float32 (16 KiB each), 4 MiB of vectors in all.
const (
	memSets   = 16
	memVecs   = 16
	memKindKV = proto.KindKey    // as the key registry stores keys
	memKindSV = proto.KindVector // as steer stores named vectors
)

// memoryOverhead measures what a region really holds: the pages resident in its two memfds
// (st_blocks, so untouched index and arena pages count nothing) against the payload stored.
// mem.overhead_ratio is resident bytes per payload byte. (mem.tp8_ratio is measured with real
// rank processes: sources.TP8.)
func memoryOverhead() (float64, error) {
	overhead, _, err := memoryRatios()
	return overhead, err
}

// memoryRatios returns the overhead ratio and the region's resident bytes.
func memoryRatios() (overhead float64, held int64, err error) {
	r, err := shm.Create(shm.Config{ArenaBytes: 64 << 20})
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	var payload int64
	_, err = r.Update(func(tx *shm.Tx) error {
		for i, k := range benchKeys() {
			v := keyValue(i)
			payload += int64(len(v))
			if err := tx.Put(memKindKV, k, v); err != nil {
				return err
			}
		}
		vec := make([]float32, kernelD)
		for s := 0; s < memSets; s++ {
			for j := 0; j < memVecs; j++ {
				for i := range vec {
					vec[i] = float32(s*j+i) / kernelD
				}
				payload += int64(4 * len(vec))
				if err := tx.PutFloat32(memKindSV, fmt.Sprintf("set-%02d/layer-%02d/hook-%d", s, j/2, j%2), vec); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	data, readers := r.Files()
	for _, f := range []interface{ Fd() uintptr }{data, readers} {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return 0, 0, fmt.Errorf("bench: stat region memfd: %w", err)
		}
		held += st.Blocks * 512
	}
	return float64(held) / float64(payload), held, nil
}
