//go:build !amd64

package shm

import "sync/atomic"

// storeRelaxed falls back to a sequentially consistent store off amd64.
func storeRelaxed(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
