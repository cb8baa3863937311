package steer

// bfloat16 blocks: the native path of a bf16 model steers its hidden states in place.
//
// The adds and clamps run in float32 (the kernels'); ApplyBF16 widens the rows the batch's
// spans cover into the Stepper's scratch, runs the site's program there, and narrows back the
// elements it changed, rounding to nearest even. The result is the bits a caller gets by
// converting the block to float32, calling Apply and converting back (torch's .float() and
// copy_), in one call and with no copy of the block in the caller's hands.

import (
	"fmt"

	"github.com/shmsteer/shmsteer/kernels"
)

// ApplyBF16 is Apply on h, a T×Hidden row-major block of bfloat16 values as little-endian
// bytes (2 per value): the same validation (ErrNoStep, ErrUnknownHook, ErrLayerRange,
// ErrBadBatch; ErrShape for a length that is not a whole number of rows), the same steering
// computed in float32 and rounded to nearest even, the same checksum and stats. Capture, when
// on, records the site's rows as bfloat16, before the adds. Rows outside every span keep
// their bytes, and so does every element the steering leaves unchanged.
func (s *Stepper) ApplyBF16(hook HookID, layer int, h []byte, batch []Span) error {
	if !s.open {
		return ErrNoStep
	}
	if err := s.checkApply(hook, layer); err != nil {
		return err
	}
	d := s.d
	if len(h)%(2*d) != 0 {
		return fmt.Errorf("%w: %d bytes is not a whole number of bfloat16 rows of hidden size %d", ErrShape, len(h), d)
	}
	rows := len(h) / (2 * d)
	if !s.sameBatch(batch, rows) {
		if err := s.resolve(batch, rows); err != nil {
			return err
		}
	}
	if s.cap.on {
		s.captureSite(hook, layer, h, CaptureBF16, false) // before the adds; exec's is then a no-op
	}
	n := s.lastEnd * d // the rows any span covers
	if cap(s.wide) < n {
		s.wide = make([]float32, n)
	}
	w := s.wide[:n]
	kernels.BF16ToF32(w, h)
	s.exec(hook, layer, w)
	kernels.F32ToBF16(h, w)
	return nil
}
