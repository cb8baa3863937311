//go:build linux

package capture

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/steer"
)

// TestConsumerNextRun: runs of one shape at one stride (Contiguous) end before the ring's
// wrap-around and at a record of another shape; without Contiguous they span the wrap; a
// record larger than the bounds is refused typed and read by the next call; bad options
// change nothing; every record's bytes and offsets are the worker's.
func TestConsumerNextRun(t *testing.T) {
	e := newHubEnv(t)
	w := e.worker(t, WorkerOptions{Capacity: 16384, Wait: time.Second})
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	e.hub.Begin("r1", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
	// 320-byte frames (64 header + 256 data): 51 fit before the 16 KiB ring's end.
	rec := runRecord
	appendN := func(from, n, rows int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			if err := w.Writer().Append("r1", rec(i, rows)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ev, ok, err := c.Next(5 * time.Second); err != nil || !ok || ev.Kind != EventBegin {
		t.Fatal(ev.Kind, ok, err)
	}
	next := 0 // the next record expected
	run := func(opt RunOptions) []Event {
		t.Helper()
		evs, err := c.NextRun(nil, opt, 5*time.Second)
		if err != nil || len(evs) == 0 {
			t.Fatal(len(evs), err)
		}
		data := c.RingData(evs[0].Ring)
		for i, ev := range evs {
			r := ev.Record
			want := rec(next, r.Rows)
			if ev.Kind != EventRecord || !bytes.Equal(r.Data, want.Data) || r.Positions[0] != next*10 || r.Layer != want.Layer {
				t.Fatalf("run record %d: want record %d, got kind %d layer %d position %v", i, next, ev.Kind, r.Layer, r.Positions)
			}
			if &data[r.DataOff] != &r.Data[0] || &data[r.PositionsOff] != &r.PositionsLE[0] {
				t.Fatalf("record %d: offsets %d, %d do not name its views", next, r.DataOff, r.PositionsOff)
			}
			if opt.Contiguous && i > 0 && r.DataOff-evs[i-1].Record.DataOff != 320 {
				t.Fatalf("record %d at %d after %d: not at the run's stride", next, r.DataOff, evs[i-1].Record.DataOff)
			}
			next++
		}
		return evs
	}
	appendN(0, 40, 1)
	if n := len(run(RunOptions{Max: 16, Contiguous: true})); n != 16 {
		t.Fatalf("a run of %d, want 16 (Max)", n)
	}
	if n := len(run(RunOptions{Max: 100, Contiguous: true})); n != 24 {
		t.Fatalf("a run of %d, want the 24 left", n)
	}
	c.Release()
	// 40 more: 11 before the ring's end (51 frames), a pad, 29 after it.
	appendN(40, 40, 1)
	if n := len(run(RunOptions{Max: 100, Contiguous: true})); n != 11 {
		t.Fatalf("a contiguous run of %d across the wrap, want the 11 before it", n)
	}
	if n := len(run(RunOptions{Max: 100, Contiguous: true})); n != 29 {
		t.Fatalf("a run of %d after the wrap, want 29", n)
	}
	c.Release()
	// Without Contiguous a run goes through the wrap: 21 before the end, 19 after.
	appendN(80, 40, 1)
	if n := len(run(RunOptions{Max: 100})); n != 40 {
		t.Fatalf("a run of %d, want all 40 through the wrap", n)
	}
	// Another shape ends a run; MaxBytes and MaxRows bound it.
	appendN(120, 3, 1)
	appendN(123, 4, 2)
	if n := len(run(RunOptions{Max: 100})); n != 3 {
		t.Fatalf("a run of %d, want the 3 one-row records", n)
	}
	checkRunRefusals(t, c)
	if n := len(run(RunOptions{Max: 4, MaxBytes: 1100})); n != 2 {
		t.Fatalf("a run of %d within 1100 bytes, want 2", n)
	}
	if n := len(run(RunOptions{Max: 4, MaxRows: 4})); n != 2 {
		t.Fatalf("a run of %d within 4 rows, want 2", n)
	}
	c.Release()
	if got := c.Stats().Received; got != 127 {
		t.Fatalf("received %d, want 127", got)
	}
	// Next's read-ahead, then NextRun: the run comes out of the records read ahead.
	appendN(127, 10, 1)
	if ev, ok, err := c.Next(time.Second); err != nil || !ok || ev.Record.Positions[0] != 1270 {
		t.Fatal(ok, err)
	}
	next++
	if n := len(run(RunOptions{Max: 100})); n != 9 {
		t.Fatalf("a run of %d from the read-ahead, want 9", n)
	}
}

// runRecord is TestConsumerNextRun's record i: rows rows of 64 bytes at positions i*10+j, a
// layer and bytes derived from i.
func runRecord(i, rows int) Record {
	r := Record{Hook: "post_block", Layer: i % 32, Dtype: Float32, Rows: rows, Width: 64, Data: make([]byte, 256*rows)}
	for j := range rows {
		r.Positions = append(r.Positions, i*10+j)
	}
	for j := range r.Data {
		r.Data[j] = byte(i*31 + j)
	}
	return r
}

// checkRunRefusals checks that bad RunOptions are refused with ErrBadRun, and that the next
// record (512 bytes in 2 rows) against a 500-byte or a 1-row bound is refused typed, not
// consumed.
func checkRunRefusals(t *testing.T, c *Consumer) {
	t.Helper()
	for _, opt := range []RunOptions{{Max: 0}, {Max: MaxRun + 1}, {Max: 1, MaxBytes: -1}, {Max: 1, MaxRows: -1}} {
		if _, err := c.NextRun(nil, opt, time.Second); !errors.Is(err, ErrBadRun) {
			t.Fatalf("%+v: %v, want ErrBadRun", opt, err)
		}
	}
	var tl *RunTooLargeError
	if _, err := c.NextRun(nil, RunOptions{Max: 4, MaxBytes: 500}, time.Second); !errors.As(err, &tl) || !errors.Is(err, ErrRunTooLarge) ||
		tl.Bytes != 512 || tl.Rows != 2 {
		t.Fatalf("%v (%+v), want ErrRunTooLarge for 512 bytes in 2 rows", err, tl)
	}
	if _, err := c.NextRun(nil, RunOptions{Max: 4, MaxRows: 1}, time.Second); !errors.As(err, &tl) || tl.Rows != 2 {
		t.Fatalf("%v, want ErrRunTooLarge for 2 rows", err)
	}
}
