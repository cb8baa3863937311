package steer

// Bound steps: a worker that applies one batch at every (hook, layer) of a step binds it once.
//
// Apply takes the batch at every call and compares it with the one it resolved (sameBatch),
// because a caller may change its spans between two calls. Bind resolves the step's batch
// once, copying it (the caller may reuse its spans at once), and ApplyBound runs a site's
// program (program.go) with nothing compared: the same program Apply runs, so the same bits,
// the same checksum and the same counts.

import "fmt"

// Bind resolves batch, the spans of a block of rows rows, as this step's batch, for
// ApplyBound. It validates it as Apply does (ErrBadBatch, ErrUnknownRequest with
// Options.StrictRequests; ErrShape for rows out of range); on error h is not involved and the
// step has no batch bound. Bind keeps a copy: the caller may change its spans at once. The
// binding lasts until End, the next Bind, or an Apply with another batch.
func (s *Stepper) Bind(batch []Span, rows int) error {
	if !s.open {
		return ErrNoStep
	}
	s.bound = false
	if rows < 0 || rows > MaxPromptLen {
		return fmt.Errorf("%w: a block of %d rows (0..%d)", ErrShape, rows, MaxPromptLen)
	}
	if err := s.resolve(batch, rows); err != nil {
		return err
	}
	s.boundRows, s.bound = rows, true
	return nil
}

// ApplyBound is Apply with the batch bound by Bind: h must be the bound block, rows × Hidden
// floats (ErrShape). ErrNoStep when the step has no bound batch. The result, the checksum and
// the stats are Apply's with that batch.
func (s *Stepper) ApplyBound(hook HookID, layer int, h []float32) error {
	if !s.open {
		return ErrNoStep
	}
	if !s.bound {
		return fmt.Errorf("%w: ApplyBound with no batch bound in this step (call Bind after Begin; an Apply with another batch unbinds it)", ErrNoStep)
	}
	if err := s.checkApply(hook, layer); err != nil {
		return err
	}
	if len(h) != s.boundRows*s.d {
		return fmt.Errorf("%w: %d floats, the bound block is %d rows of %d", ErrShape, len(h), s.boundRows, s.d)
	}
	s.exec(hook, layer, h)
	return nil
}
