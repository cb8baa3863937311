// Package dense is the gorgonia tensor adapter of package steer: it applies a step's steering
// to a *tensor.Dense in place, without copying. It lives apart from steer so that a worker that
// steers plain []float32 blocks (steer.Stepper.Apply) does not compile gorgonia and its
// dependencies (arrow, protobuf, gonum). It reads the tensor's storage only through gorgonia's
// API and must not touch steering state: everything else is steer's.
//
// To start: between a Stepper's Begin and End, Apply(stepper, hook, layer, t, batch) steers a
// [tokens, hidden] float32 tensor; Rows views one as the []float32 steer.Stepper.Apply takes.
package dense

import (
	"errors"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/shmsteer/shmsteer/steer"
)

var (
	// ErrDtype means a tensor is not float32.
	ErrDtype = errors.New("shmsteer: tensor is not float32")
	// ErrNotContiguous means a tensor is a non-contiguous (strided, transposed or masked) view:
	// pass a contiguous row-major tensor (tensor.Dense.Materialize makes one).
	ErrNotContiguous = errors.New("shmsteer: tensor is not contiguous row-major")
)

// Apply is steer.Stepper.Apply on a gorgonia tensor, in place and without copying: t must be a
// float32 tensor whose last dimension is the hidden size (any leading dimensions are flattened
// into rows, so a [batch, seq, hidden] tensor has batch*seq rows) and whose data is contiguous
// row-major (a row slice of a larger tensor is fine; a column slice, a transpose or a masked
// tensor is not). ErrDtype, steer.ErrShape or ErrNotContiguous otherwise, and t is unchanged.
func Apply(s *steer.Stepper, hook steer.HookID, layer int, t *tensor.Dense, batch []steer.Span) error {
	h, err := Rows(t, s.Hidden())
	if err != nil {
		return err
	}
	return s.Apply(hook, layer, h, batch)
}

// Rows returns t's elements as one row-major []float32 aliasing its storage, checking what
// Apply documents against hidden size d.
func Rows(t *tensor.Dense, d int) ([]float32, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: nil tensor", steer.ErrShape)
	}
	if t.Dtype() != tensor.Float32 {
		return nil, fmt.Errorf("%w: dtype %v", ErrDtype, t.Dtype())
	}
	shape := t.Shape()
	if len(shape) == 0 || shape[len(shape)-1] != d {
		return nil, fmt.Errorf("%w: shape %v, last dimension must be the hidden size %d", steer.ErrShape, shape, d)
	}
	n := shape.TotalSize()
	if t.RequiresIterator() || t.IsMasked() {
		return nil, fmt.Errorf("%w: shape %v strides %v", ErrNotContiguous, shape, t.Strides())
	}
	// Row-major strides: each dimension's stride is the product of the dimensions after it.
	// (A view can be contiguous in memory yet column-major; reject that too.)
	st, want := t.Strides(), 1
	if len(st) == len(shape) {
		for i := len(shape) - 1; i >= 0; i-- {
			if shape[i] > 1 && st[i] != want {
				return nil, fmt.Errorf("%w: shape %v strides %v", ErrNotContiguous, shape, st)
			}
			want *= shape[i]
		}
	}
	data := t.Float32s()
	if len(data) < n {
		return nil, fmt.Errorf("%w: %d elements backing a tensor of %d", ErrNotContiguous, len(data), n)
	}
	return data[:n:n], nil
}
