package steer

import (
	"fmt"

	"github.com/shmsteer/shmsteer/shm"
)

// Worker is the steering engine of a process attached to the owner's region (a GPU worker, a
// tensor-parallel rank): it reads the region in place and steers through Steppers and
// Batches. Its writes (Register, Unregister, the probe writes, SetGlobal) go to the owner as
// one RPC each through Options.Caller; without a Caller it only reads and they fail with
// ErrNotOwner. Admissions, latches, conversations' gates, capture consumers, observers and
// Serve belong to the Owner and do not exist here: everything a Worker has is its Engine's.
type Worker struct {
	*Engine
}

// Attach binds a worker's engine to a region this process attached to (ipc.Client.Region, or
// shm.Open of the owner's files). A nil want reads the region's config; else it must equal
// it (ErrIncompatible). The region of this process's own owner gives ErrNotOwner: the owner
// opens it with Open. Options.Caller carries writes to the owner; the owner-only options
// (Latch, CaptureConsumers, CaptureGlobal) are ignored.
func Attach(r *shm.Region, want *ModelConfig, opt Options) (*Worker, error) {
	if r.IsOwner() {
		return nil, fmt.Errorf("%w: this process created the region: open the owner's engine with steer.Open", ErrNotOwner)
	}
	opt.CaptureConsumers, opt.CaptureGlobal = nil, nil
	e, err := openEngine(r, want, opt)
	if err != nil {
		return nil, err
	}
	e.w = readOnly{}
	if opt.Caller != nil {
		e.w = remote{e, opt.Caller}
	}
	return &Worker{Engine: e}, nil
}
