package vecfile

import (
	"errors"
	"fmt"
	"strings"
)

// Errors returned by Import and Export. Each is wrapped with the file name, the tensor and the
// expected shape; test with errors.Is. Mismatches against the model also match steer's
// sentinels (steer.ErrHiddenSize, steer.ErrLayerRange, steer.ErrUnknownHook,
// steer.ErrNonFinite, steer.ErrDuplicate), so callers that already map those keep working.
var (
	// ErrTooLarge means the input is larger than ImportOptions.MaxBytes; nothing was read.
	// Raise MaxBytes if the file is genuine.
	ErrTooLarge = errors.New("shmsteer: vector file larger than the size cap")
	// ErrUnknownFormat means the format could not be recognised from the magic bytes or the
	// extension, or is not one of gguf, npy, npz, safetensors.
	ErrUnknownFormat = errors.New("shmsteer: unknown vector file format")
	// ErrCorrupt means the file is truncated or its structure is invalid (bad magic, a length
	// or offset beyond the end of the file, trailing bytes, a malformed header).
	ErrCorrupt = errors.New("shmsteer: corrupt or truncated vector file")
	// ErrDtype means a tensor's element type is not one this package converts (float16,
	// bfloat16 (safetensors), float32, float64; GGUF control vectors must be float32 as in
	// llama.cpp).
	ErrDtype = errors.New("shmsteer: unsupported tensor dtype")
	// ErrShape means a tensor's shape is not [hidden] or [layers, hidden] for the model; the
	// message gives the expected shape.
	ErrShape = errors.New("shmsteer: tensor shape does not fit the model")
	// ErrValueRange means a float64 value is too large for float32.
	ErrValueRange = errors.New("shmsteer: value does not fit float32")
	// ErrTensorName means a tensor name does not say which hook and layer it steers (see the
	// package doc for the accepted names).
	ErrTensorName = errors.New("shmsteer: tensor name does not name a hook and layer")
	// ErrNeedLayers means a single [hidden] array was given without ImportOptions.Layers to say
	// which layers it steers.
	ErrNeedLayers = errors.New("shmsteer: a [hidden] array needs a layer range (--layers)")
	// ErrNoVectors means the file (after the layer range) steers nothing: no tensors, or only
	// all-zero rows.
	ErrNoVectors = errors.New("shmsteer: vector file steers nothing")
	// ErrUnrepresentable means Export cannot write the vectors in the format asked for (GGUF
	// holds only post_block at layers ≥ 1; npy holds one hook); the message says which to use.
	ErrUnrepresentable = errors.New("shmsteer: vectors cannot be written in this format")
	// ErrBadOptions means an ImportOptions or ExportOptions field is invalid (negative or
	// reversed layer range, non-finite scale).
	ErrBadOptions = errors.New("shmsteer: bad vector file options")
)

// ownSentinels are the errors the parsers return before the file name is known.
var ownSentinels = []error{ErrCorrupt, ErrUnknownFormat, ErrDtype, ErrShape, ErrTooLarge, ErrValueRange, ErrTensorName}

// rewrap puts context (a file name, a tensor) right after err's sentinel, so every message
// reads "shmsteer: <what>: <file>: <tensor>: <detail>".
func rewrap(context string, err error) error {
	for _, s := range ownSentinels {
		if errors.Is(err, s) {
			rest := strings.TrimPrefix(err.Error(), s.Error()+": ")
			return fmt.Errorf("%w: %s: %s", s, context, rest)
		}
	}
	return fmt.Errorf("%s: %w", context, err)
}
