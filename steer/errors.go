package steer

import "errors"

var (
	// ErrIncompatible means the region's recorded model config differs from the one this
	// process expects (start every process with the same model config), or was not written by
	// this steer version (then it also matches shm.ErrIncompatible with errors.Is).
	ErrIncompatible = errors.New("shmsteer: incompatible steering config")
	// ErrBadConfig means a ModelConfig field is out of range; the message names it.
	ErrBadConfig = errors.New("shmsteer: bad steering config")
	// ErrBadName means a vector name is empty or longer than MaxNameLen bytes.
	ErrBadName = errors.New("shmsteer: vector name empty or longer than 256 bytes")
	// ErrNonFinite means a vector, scale, strength or clamp bound is NaN or infinite.
	ErrNonFinite = errors.New("shmsteer: non-finite value")
	// ErrOverflow means a coefficient, a term or a composed sum of steering exceeds MaxMagnitude,
	// so applying it could write ±Inf into hidden states; the message names the steering set,
	// tier, hook, layer and the offending value. Scale the vectors down.
	ErrOverflow = errors.New("shmsteer: steering magnitude out of range")
	// ErrHiddenSize means a vector's length is not the model's hidden size.
	ErrHiddenSize = errors.New("shmsteer: vector length is not the hidden size")
	// ErrUnknownHook means a hook name is not one of the model's hooks.
	ErrUnknownHook = errors.New("shmsteer: unknown hook")
	// ErrLayerRange means a layer index is outside [0, layers).
	ErrLayerRange = errors.New("shmsteer: layer out of range")
	// ErrDuplicate means a steering set names the same (hook, layer) twice in one tier.
	ErrDuplicate = errors.New("shmsteer: duplicate (hook, layer) in a steering set")
	// ErrEmptySet means a named vector was registered with no entries.
	ErrEmptySet = errors.New("shmsteer: named vector has no entries")
	// ErrBadClamp means a clamp has a zero direction, min > max, or a strength outside [0, 1].
	ErrBadClamp = errors.New("shmsteer: bad clamp")
	// ErrUnknownVector means a reference names a vector that is not registered.
	ErrUnknownVector = errors.New("shmsteer: unknown named vector")
	// ErrBadRequestID means a request id is empty or longer than MaxIDLen bytes.
	ErrBadRequestID = errors.New("shmsteer: request id empty or too long")
	// ErrBadEncoding means bytes read from the region or an RPC are not valid steering wire
	// format; the message says what failed.
	ErrBadEncoding = errors.New("shmsteer: bad steering encoding")
	// ErrNotOwner means an operation on the wrong side of a region: Open (the owner's side) on
	// a region this process attached to, Attach (a worker's side) on one it created, or a
	// write from a Worker that has no Caller to reach the owner (or with an owner-only option:
	// Origin, If).
	ErrNotOwner = errors.New("shmsteer: wrong side of the region: the owner opens the region it created (steer.Open); a worker the one it attached to (steer.Attach), and writes through its client connection")
	// ErrNoStep means Apply was called on a Stepper outside Begin/End, or ApplyBound in a
	// step with no batch bound (call Bind after Begin).
	ErrNoStep = errors.New("shmsteer: no step begun")
	// ErrBadBatch means a batch span is out of the block's rows, reversed, overlaps another
	// span's rows, has an empty id or a phase other than PhasePrefill or PhaseDecode.
	ErrBadBatch = errors.New("shmsteer: bad batch layout")
	// ErrUnknownRequest means a span names a request with no admitted entry (never admitted,
	// already ended, or a mistyped id) while Options.StrictRequests is set.
	ErrUnknownRequest = errors.New("shmsteer: span names a request that was not admitted")
	// ErrNotServed means the owner has no handler for steering writes: call Owner.Serve in the
	// owner (with its ipc.Owner's Handle) before workers register vectors.
	ErrNotServed = errors.New("shmsteer: the owner does not serve steering writes: call Owner.Serve(func(op uint16, h func([]byte) ([]byte, error)) { owner.Handle(op, h) }) in the owner")
	// ErrShape means a hidden-state block's length or shape does not fit the model.
	ErrShape = errors.New("shmsteer: bad hidden-state shape")
	// ErrRemote means the owner answered an RPC with an error this build does not know.
	ErrRemote = errors.New("shmsteer: owner reported an error")
)

// ErrBatchCapacity means a step's batch does not fit a Batch's tables: more distinct (request,
// phase) compositions than BatchOptions.MaxSlots, or more clamp directions at one site than
// MaxClamps. Raise the limit (and the device tables with it) or split the batch.
var ErrBatchCapacity = errors.New("shmsteer: batch does not fit the steering tables")

var (
	// ErrCaptureConsumer means an admission's capture names a consumer the owner does not
	// declare (Options.CaptureConsumers; serve's --capture-consumer NAME=TYPE) or names more
	// than MaxCaptureConsumers. Declare the consumer in the owner or fix the name.
	ErrCaptureConsumer = errors.New("shmsteer: capture consumer not declared by the owner")
	// ErrCaptureSpecTooLarge means a consumer's capture spec is larger than MaxCaptureSpec
	// bytes: select fewer hooks or positions.
	ErrCaptureSpecTooLarge = errors.New("shmsteer: capture spec too large")
)
