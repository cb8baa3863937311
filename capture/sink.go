//go:build linux

package capture

import (
	"fmt"

	"github.com/shmsteer/shmsteer/steer"
)

// RingSink is the steer.CaptureSink of a worker's ring: each record the hooks hand it is
// framed into the ring by its writer (AppendRows: the rows copied from the hidden state
// straight into the mapping) and held until Flush publishes them (the hooks flush after each
// site's records: one store of the write position per site, not per request). Use it from the
// stepping goroutine only, as the writer.
type RingSink struct{ w *RingWriter }

// NewRingSink makes the sink over w.
func NewRingSink(w *RingWriter) *RingSink { return &RingSink{w: w} }

var sinkDtypes = [...]Dtype{steer.CaptureF32: Float32, steer.CaptureBF16: BFloat16, steer.CaptureF16: Float16}

// Capture appends rec's rows as one record: ErrBadRecord for an unknown dtype or rows that do
// not fit rec.Src, else what RingWriter.AppendRows returns (ErrDropped when a lagging
// consumer's policy gave it up).
func (s *RingSink) Capture(rec *steer.CaptureRecord) error {
	if int(rec.Dtype) >= len(sinkDtypes) || sinkDtypes[rec.Dtype] == "" {
		return fmt.Errorf("%w: dtype %s", ErrBadRecord, rec.Dtype)
	}
	if len(rec.Rows) != len(rec.Positions) {
		return fmt.Errorf("%w: %d rows for %d positions", ErrBadRecord, len(rec.Rows), len(rec.Positions))
	}
	s.w.Hold()
	return s.w.AppendRows(rec.RequestID, Record{Layer: rec.Layer, Hook: rec.Hook, Positions: rec.Positions, Dtype: sinkDtypes[rec.Dtype], Width: rec.Width}, rec.Src, rec.Rows)
}

// Flush publishes the records Capture appended since the last Flush.
func (s *RingSink) Flush() { s.w.Flush() }

var _ steer.CaptureFlusher = (*RingSink)(nil)
