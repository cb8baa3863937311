package steer

import (
	"fmt"

	"gorgonia.org/tensor"
)

// ApplyDense is Apply on a gorgonia tensor, in place and without copying: t must be a float32
// tensor whose last dimension is the hidden size (any leading dimensions are flattened into rows,
// so a [batch, seq, hidden] tensor has batch*seq rows) and whose data is contiguous row-major
// (a row slice of a larger tensor is fine; a column slice, a transpose or a masked tensor is
// not). ErrDtype, ErrShape or ErrNotContiguous otherwise.
func (s *Stepper) ApplyDense(hook HookID, layer int, t *tensor.Dense, batch []Span) error {
	h, err := denseRows(t, s.d)
	if err != nil {
		return err
	}
	return s.Apply(hook, layer, h, batch)
}

// denseRows returns t's elements as one row-major []float32 aliasing its storage.
func denseRows(t *tensor.Dense, d int) ([]float32, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: nil tensor", ErrShape)
	}
	if t.Dtype() != tensor.Float32 {
		return nil, fmt.Errorf("%w: dtype %v", ErrDtype, t.Dtype())
	}
	shape := t.Shape()
	if len(shape) == 0 || shape[len(shape)-1] != d {
		return nil, fmt.Errorf("%w: shape %v, last dimension must be the hidden size %d", ErrShape, shape, d)
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
