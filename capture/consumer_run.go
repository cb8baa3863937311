//go:build linux

package capture

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrBadRun: NextRun's options are out of range (Max not in [1, MaxRun], MaxBytes negative).
var ErrBadRun = errors.New("shmsteer: bad capture run options")

// ErrRunTooLarge: NextRun's next record has more data bytes or rows than the run's bounds
// (RunOptions.MaxBytes and MaxRows: a reader's buffers) allow. The record is not consumed:
// read it with larger bounds (RunTooLargeError says how large).
var ErrRunTooLarge = errors.New("shmsteer: capture record larger than the reader's buffer")

// RunTooLargeError is ErrRunTooLarge with the sizes: the record's data bytes and rows, and
// the bounds it exceeds.
type RunTooLargeError struct{ Bytes, Rows, MaxBytes, MaxRows int }

func (e *RunTooLargeError) Error() string {
	return fmt.Sprintf("%v: the next record has %d data bytes in %d rows, the buffers hold %d bytes and %d rows (0: no bound): read it with buffers at least that large",
		ErrRunTooLarge, e.Bytes, e.Rows, e.MaxBytes, e.MaxRows)
}

func (e *RunTooLargeError) Unwrap() error { return ErrRunTooLarge }

// MaxRun is the most records one NextRun (or NextBatch) returns.
const MaxRun = 1 << 16

// RunOptions bound a run of records (Consumer.NextRun).
type RunOptions struct {
	// Max is the most records in the run, 1 to MaxRun.
	Max int
	// MaxBytes bounds the run's data bytes in all, MaxRows its rows (0: no bound). A next
	// record larger than either alone is not read: ErrRunTooLarge.
	MaxBytes, MaxRows int
	// Contiguous: every record's data and positions lie at one stride from the previous
	// record's in the ring's data area (Consumer.RingData), so one strided view covers the
	// run; the run then ends before a pad (the ring's wrap-around) or a skipped record.
	// Without it a run may span the wrap-around (for a reader that copies the rows out).
	Contiguous bool
}

// NextRun is NextBatch for a run of records of one shape, appended to dst: the first event as
// Next returns it, then, if it is a record, the records that follow it in the same ring with
// the same hook, dtype, rows and width (their layers and requests may differ), until opt.Max, opt.MaxBytes, a begin notice, a record of
// another shape or ring, or (opt.Contiguous) a record off the run's stride. The record that
// ends a run is not consumed: the next call returns it. Views stay valid until the next Next,
// NextBatch, NextRun or Release, as NextBatch's do. ErrBadRun for options out of range,
// ErrRunTooLarge (nothing consumed) when the next record alone exceeds opt.MaxBytes.
func (c *Consumer) NextRun(dst []Event, opt RunOptions, wait time.Duration) ([]Event, error) {
	if opt.Max < 1 || opt.Max > MaxRun || opt.MaxBytes < 0 || opt.MaxRows < 0 {
		return dst, fmt.Errorf("%w: max %d not in [1, %d], or max bytes %d or max rows %d negative", ErrBadRun, opt.Max, MaxRun, opt.MaxBytes, opt.MaxRows)
	}
	return c.run(dst, opt, true, wait)
}

// run is NextRun (shape true) and NextBatch (shape false).
func (c *Consumer) run(dst []Event, opt RunOptions, shape bool, wait time.Duration) ([]Event, error) {
	if c.aheadAt < len(c.ahead) {
		// Next read these ahead: the run is their longest prefix that fits.
		var run runState
		n := 0
		for _, ev := range c.ahead[c.aheadAt:] {
			if n == opt.Max || !run.add(&ev, opt, shape) {
				break
			}
			n++
		}
		if n == 0 {
			return dst, tooLarge(&c.ahead[c.aheadAt], opt)
		}
		dst = append(dst, c.ahead[c.aheadAt:c.aheadAt+n]...)
		c.takeAhead(n)
		return dst, nil
	}
	if err := c.aheadErr; err != nil {
		c.aheadErr = nil
		return dst, err
	}
	return c.nextRun(dst, opt, shape, wait)
}

func tooLarge(ev *Event, opt RunOptions) error {
	return &RunTooLargeError{Bytes: len(ev.Record.Data), Rows: ev.Record.Rows, MaxBytes: opt.MaxBytes, MaxRows: opt.MaxRows}
}

// runState is what a run's next record must match: the first's ring, hook and shape, the previous
// record's offsets and the run's stride.
type runState struct {
	n               int
	ring            uint32
	hook            string
	dtype           Dtype
	rows, width     int
	dataOff, posOff int
	stride, bytes   int
	nrows           int
}

// add reports whether ev continues the run, and adds it when it does: the first event always
// (but a record larger than opt's bounds); then records of the first's ring, hook and shape
// (with shape false, NextBatch's, any record) within the bounds.
func (s *runState) add(ev *Event, opt RunOptions, shape bool) bool {
	r := &ev.Record
	if s.n > 0 && ev.Kind != EventRecord {
		return false
	}
	if (opt.MaxBytes > 0 && s.bytes+len(r.Data) > opt.MaxBytes) || (opt.MaxRows > 0 && s.nrows+r.Rows > opt.MaxRows) {
		return false
	}
	switch {
	case s.n == 0:
		s.ring, s.hook, s.dtype, s.rows, s.width = ev.Ring, r.Hook, r.Dtype, r.Rows, r.Width
	case !shape:
	case ev.Ring != s.ring || r.Hook != s.hook || r.Dtype != s.dtype || r.Rows != s.rows || r.Width != s.width:
		return false
	case opt.Contiguous:
		d, p := r.DataOff-s.dataOff, r.PositionsOff-s.posOff
		if d <= 0 || d != p || (s.n > 1 && d != s.stride) {
			return false
		}
		s.stride = d
	}
	s.n++
	s.dataOff, s.posOff = r.DataOff, r.PositionsOff
	s.bytes += len(r.Data)
	s.nrows += r.Rows
	return true
}

// nextRun reads a batch (shape false: NextBatch's, any records of the first's ring) or a run.
func (c *Consumer) nextRun(dst []Event, opt RunOptions, shape bool, wait time.Duration) ([]Event, error) {
	ev, ok, err := c.next(wait)
	if err != nil || !ok {
		return dst, err
	}
	var run runState
	if !run.add(&ev, opt, shape) {
		c.last.rd.unread() // too large: read again by the next call
		return dst, tooLarge(&ev, opt)
	}
	dst = append(dst, ev)
	if ev.Kind != EventRecord {
		return dst, nil
	}
	// The rest of the run comes from the first's ring: its records lie one after another.
	ring := slices.Index(c.rings, c.last)
	c.hold = true
	defer func() { c.hold = false }()
	for n := 1; n < opt.Max && len(c.queued) == 0 && ring >= 0; n++ {
		// Decoded in its place at the end of dst (an Event is large to copy).
		dst = append(dst, Event{})
		ev := &dst[len(dst)-1]
		ok, err := c.ringRecord(ring, ev)
		if err == nil && ok && !run.add(ev, opt, shape) {
			c.last.rd.unread()
			ok = false
		}
		if err != nil || !ok {
			*ev = Event{}
			return dst[:len(dst)-1], err
		}
	}
	return dst, nil
}
