package steer

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/shmsteer/shmsteer/internal/observe"
	"github.com/shmsteer/shmsteer/shm"
)

// Owner is the steering engine of the process that created the region (the scheduler, or
// shmsteer serve): its only writer. Besides what every side has (the embedded Engine: reads,
// Register, SetGlobal, Steppers) it decides admissions (Admit, End), keeps the conversation
// latches and rest_of_conversation gates in private memory (Latches, RestoreLatches,
// GateConversations, ...), declares the capture consumers, tells observers of its writes
// (OnChange) and serves the writes workers send (Serve). None of these exist on a Worker.
type Owner struct {
	*Engine

	mu       sync.Mutex // serializes steering writes (latch order is the call order)
	latches  *Latches
	deps     deps      // which sets reference which named vectors
	gateConv gateConvs // conversations' rest_of_conversation gates (gates_conv.go)
	// columnsFallbacks is Status.ColumnsFallbacks.
	columnsFallbacks atomic.Uint64

	observers observe.List[Change] // OnChange callbacks (observe.go)
}

// Open binds the owner's engine to the region this process created (shm.Create, or
// ipc.Owner.Region). The region must have been created with RegionConfig; if want is not nil
// the recorded config must equal it, else ErrIncompatible naming both configs. A region this
// process attached to gives ErrNotOwner: a worker opens it with Attach.
func Open(r *shm.Region, want *ModelConfig, opt Options) (*Owner, error) {
	if !r.IsOwner() {
		return nil, fmt.Errorf("%w: this process attached to the region: open a worker's engine with steer.Attach", ErrNotOwner)
	}
	e, err := openEngine(r, want, opt)
	if err != nil {
		return nil, err
	}
	if err := e.checkGlobal(); err != nil {
		return nil, err
	}
	lc := opt.Latch
	if lc.Logf == nil {
		lc.Logf = opt.Logf
	}
	o := &Owner{Engine: e, latches: NewLatches(lc)}
	e.w = local{o}
	return o, nil
}

// Latches is the owner's conversation latch map.
func (e *Owner) Latches() *Latches { return e.latches }

// ColumnsFallbacks is Status.ColumnsFallbacks without reading the rest of the state.
func (e *Owner) ColumnsFallbacks() uint64 { return e.columnsFallbacks.Load() }

// Admit decides the steering of a request: its override, its conversation's latch, or both
// (Override.Compose), runs the latch operation, and publishes the result under KindRequest so
// every rank reads it. A request with no request steering gets an empty entry (64 bytes), so
// Steppers can tell it from an id that was never admitted (StepStats). Invalid overrides fail
// with a typed error before anything changes.
func (e *Owner) Admit(a Admission) (Admitted, error) { return local{e}.admit(a) }

// End removes a finished request's steering. Its conversation's latch stays.
func (e *Owner) End(requestID string) (uint64, error) { return local{e}.end(requestID) }

// DropConversation removes a conversation's latch, e.g. when it is closed.
func (e *Owner) DropConversation(k ConvKey) (bool, error) { return local{e}.dropConversation(k) }

// ownStatus fills what only the owner knows: whether latching is off before any admission
// published the counters, and its count of column pool fallbacks.
func (l local) ownStatus(st *Status, published bool) {
	if !published {
		st.LatchingOff = l.e.latches.Stats().Off
	}
	st.ColumnsFallbacks = l.e.ColumnsFallbacks()
}
