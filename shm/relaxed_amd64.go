package shm

// storeRelaxed stores v to *p atomically with release ordering and no store-load fence.
//
//go:noescape
func storeRelaxed(p *uint64, v uint64)
