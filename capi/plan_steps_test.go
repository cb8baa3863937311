//go:build cgo && linux

package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// TestPlanNativeStepsInC runs native steps through the C ABI's order, the plan first (resolve,
// applies, end), against a stepper without a plan that Go runs: a native resolve arms C's end
// of its step, and the next steps of the same batch (positions advanced) begin and end in C
// without Go, holding the version's pin from begin to end; an owner write, a Go call in the
// middle of a step C began (which Go then takes over), other sites at the end, and a freed
// batch leave C. At every step the bytes, the batch and step checksums and, once Go counts
// what C did, every counter equal the stepper's without a plan.
func TestPlanNativeStepsInC(t *testing.T) {
	for _, bf16 := range []bool{false, true} {
		t.Run(fmt.Sprint("bf16=", bf16), func(t *testing.T) { testPlanNativeSteps(t, bf16) })
	}
}

func testPlanNativeSteps(t *testing.T, bf16 bool) {
	pp := newPlanPair(t, bf16)
	for si, stp := range nativeSteps(pp.attached) {
		pp.nativeStep(si, stp)
	}
	// Fewer rows than the spans reach: Go's refusal, not C's begin.
	short := pp.spans(98, "c-0", "entry", "c-2", "plain")
	_, rcRef := probeResolveNative(pp.bRef, short, 2)
	_, rc, inC := probeResolveC(pp.bFast, short, 2)
	require.NotZero(t, rc, "rows short of the spans")
	require.Equal(t, rcRef, rc)
	require.False(t, inC)
	short.free()
	require.Equal(t, probeStats(pp.ref), probeStats(pp.fast), "every counter, once Go counted C's steps")
	pp.freedBatch()
}

// nativeStep is a step of TestPlanNativeStepsInC: the sites applied, what happens before it,
// and where it begins and ends.
type nativeStep struct {
	sites        []int32
	late         bool // an owner write before it
	statsMid     bool // a Go call (stats) between its resolve and its applies
	pad          int  // rows past the spans' (a padded block)
	swap         bool // two requests' rows exchanged (ids of the same length)
	begin, endIn bool // begins in C, ends in C
}

func nativeSteps(attached []int32) []nativeStep {
	return []nativeStep{
		{sites: attached, endIn: true},              // Go: a new program; Go's resolve arms C's begin and end
		{sites: attached, begin: true, endIn: true}, // all in C
		{sites: attached, begin: true, endIn: true},
		{sites: attached, begin: true, endIn: true},
		{sites: attached, late: true, endIn: true}, // a new version: Go begins
		{sites: attached, begin: true, endIn: true},
		{sites: attached, begin: true, statsMid: true}, // Go takes the step over: Go ends it
		{sites: attached, endIn: true},                 // the Go call disarmed C's begin, not its end
		{sites: attached, begin: true, endIn: true},
		{sites: attached, begin: true, endIn: true},
		{sites: attached[:2], begin: true},              // other sites: Go ends it
		{sites: attached[:2], begin: true, endIn: true}, // armed for these now
		{sites: attached[:2], begin: true, endIn: true},
		{sites: attached, begin: true}, // back: Go ends
		{sites: attached, begin: true, endIn: true},
		{sites: attached, begin: true, endIn: true},
		{sites: attached, swap: true, endIn: true},              // other ids in the rows: Go, a new program
		{sites: attached, swap: true, begin: true, endIn: true}, // Go's resolve armed both
		{sites: attached, swap: true, begin: true, endIn: true},
		{sites: attached, endIn: true},         // swapped back: Go, a new program
		{sites: attached, pad: 2, endIn: true}, // a block of other rows: Go begins
		{sites: attached, pad: 2, begin: true, endIn: true},
	}
}

// planPair is a stepper with a plan and one without on one owner (planOwner), each with a
// batch restricted to the same sites.
type planPair struct {
	t                      *testing.T
	o                      *steer.Owner
	bf16                   bool
	d, elem, rows          int
	L                      int32
	attached               []int32
	ref, fast, bRef, bFast uint64
	rng                    *rand.Rand
}

func newPlanPair(t *testing.T, bf16 bool) *planPair {
	o, cfg := planOwner(t)
	pp := &planPair{t: t, o: o, bf16: bf16, d: cfg.Hidden, elem: 4, rows: 5, L: int32(cfg.Layers), rng: rand.New(rand.NewPCG(9, 10))}
	if bf16 {
		pp.elem = 2
	}
	pp.attached = []int32{2*pp.L + 0, 1*pp.L + 2, 4*pp.L + 1}
	pp.ref, pp.fast, pp.bRef, pp.bFast = planSteppers(t, o, pp.attached)
	return pp
}

// spans is a decode batch of one row per id, at position pos, in C memory.
func (pp *planPair) spans(pos int, ids ...string) *cSpans {
	var spans []steer.Span
	for i, id := range ids {
		spans = append(spans, steer.Span{ID: id, Start: i, End: i + 1, Phase: steer.PhaseDecode, Pos: pos})
	}
	return newCSpans(spans)
}

// nativeStep runs step si on both steppers (resolve, applies, end; the plan's first) and checks
// where it ran and that both gave the same.
func (pp *planPair) nativeStep(si int, stp nativeStep) {
	t, region := pp.t, pp.o.Engine.Region()
	what := fmt.Sprintf("step %d", si)
	if stp.late {
		_, err := pp.o.Admit(steer.Admission{RequestID: fmt.Sprint("late-", si)})
		require.NoError(t, err)
	}
	ids := []string{"c-0", "entry", "c-2", "plain"}
	if stp.swap {
		ids = []string{"c-2", "entry", "c-0", "plain"}
	}
	cs := pp.spans(20+si, ids...)
	defer cs.free()
	rows := pp.rows + stp.pad
	sumRef, rcRef := probeResolveNative(pp.bRef, cs, rows)
	sum, rc, inC := probeResolveC(pp.bFast, cs, rows)
	require.Zero(t, rcRef, what)
	require.Zero(t, rc, what)
	require.Equal(t, stp.begin, inC, "%s begins in C", what)
	require.Equal(t, sumRef, sum, "%s batch checksum", what)
	if inC {
		require.EqualValues(t, 2, region.Stats().ReadersPinned, "%s: both steps pinned, C's too", what)
	}
	if stp.statsMid {
		require.Equal(t, probeStats(pp.ref).Steps, probeStats(pp.fast).Steps, what)
	}
	for _, site := range stp.sites {
		want := planBlock(pp.rng, rows*pp.d, pp.bf16)
		got := slices.Clone(want)
		rcRef, _ := probeApply(pp.ref, uint32(site/pp.L), site%pp.L, unsafe.Pointer(&want[0]), len(want)/pp.elem, pp.bf16, cs)
		rc, _ := probeApply(pp.fast, uint32(site/pp.L), site%pp.L, unsafe.Pointer(&got[0]), len(got)/pp.elem, pp.bf16, cs)
		require.Zero(t, rcRef, what)
		require.Zero(t, rc, what)
		require.Equal(t, want, got, "%s site %d", what, site)
	}
	stepRef, rcRef := probeEnd(pp.ref)
	step, rc, endC := probeEndC(pp.fast)
	require.Zero(t, rcRef, what)
	require.Zero(t, rc, what)
	require.Equal(t, stp.endIn, endC, "%s ends in C", what)
	require.Equal(t, stepRef, step, "%s step checksum", what)
	require.Zero(t, region.Stats().ReadersPinned, "%s: no pin left after the end", what)
}

// freedBatch frees the fast batch while a step C began is open: Go takes the step over, then
// the batch goes, and nothing is left pinned.
func (pp *planPair) freedBatch() {
	t := pp.t
	cs := pp.spans(99, "c-0", "entry", "c-2", "plain")
	defer cs.free()
	applyAll := func() {
		for _, site := range pp.attached {
			block := planBlock(pp.rng, pp.rows*pp.d, pp.bf16)
			rc, _ := probeApply(pp.fast, uint32(site/pp.L), site%pp.L, unsafe.Pointer(&block[0]), len(block)/pp.elem, pp.bf16, cs)
			require.Zero(t, rc)
		}
	}
	_, rc, inC := probeResolveC(pp.bFast, cs, pp.rows) // the last Go call disarmed C's begin: Go
	require.Zero(t, rc)
	require.False(t, inC)
	applyAll()
	_, rc, inC = probeEndC(pp.fast)
	require.Zero(t, rc)
	require.True(t, inC, "the armed end: C")
	_, rc, inC = probeResolveC(pp.bFast, cs, pp.rows)
	require.Zero(t, rc)
	require.True(t, inC, "the batch's next step begins in C")
	applyAll()
	require.Zero(t, probeBatchFree(pp.bFast))
	_, rc, inC = probeResolveC(pp.bFast, cs, pp.rows)
	require.NotZero(t, rc, "a freed batch")
	require.False(t, inC)
	_, rc, _ = probeEndC(pp.fast)
	require.Zero(t, rc)
	require.Zero(t, pp.o.Engine.Region().Stats().ReadersPinned, "no pin left")
}

// TestPlanStepsUnderWrites steps a steady batch through the plan (begin, apply, end; in C
// whenever the version holds) while an owner goroutine rewrites request "c-0"'s steering at
// random moments (every element of the k-th write is k) and reclaims: the row "c-0" gets is
// always one whole written vector, never a mix of two or a reused cell, and k never goes back;
// the other rows get their unchanging steering; some steps ran wholly in C; no pin is left.
func TestPlanStepsUnderWrites(t *testing.T) {
	w := newWrittenStepper(t)
	require.NoError(t, w.admitK(1))
	// A step C began keeps its version while the owner writes and reclaims under it.
	w.step(0, nil) // Go arms
	k, began, _ := w.step(1, nil)
	require.True(t, began)
	require.Equal(t, float32(1), k[0])
	k, began, _ = w.step(2, func() {
		for v := 100; v < 104; v++ {
			require.NoError(t, w.admitK(v))
			require.NoError(t, w.o.Engine.Region().Reclaim())
		}
	})
	require.True(t, began)
	require.Equal(t, float32(1), k[0], "the version C pinned: its cells were not reclaimed")
	k, began, _ = w.step(3, nil)
	require.False(t, began, "a new version: Go")
	require.Equal(t, float32(103), k[0])

	stop, done := make(chan struct{}), make(chan error, 1)
	go w.write(200, stop, done)
	var row1 []float32
	last, whole, d := float32(103), 0, w.d
	steps := 3000
	if testing.Short() {
		steps = 800
	}
	for step := range steps {
		block, began, ended := w.step(step, nil)
		k := block[0]
		for j := range d {
			require.Equal(t, k, block[j], "step %d: c-0's row is one whole write", step)
		}
		require.GreaterOrEqual(t, k, last, "step %d: a write never goes back", step)
		last = k
		if row1 == nil {
			row1 = slices.Clone(block[d : 2*d])
		}
		require.Equal(t, row1, block[d:2*d], "step %d: c-1's steering", step)
		require.Equal(t, make([]float32, d), block[2*d:], "step %d: an unsteered row", step)
		if began && ended {
			whole++
		}
	}
	close(stop)
	require.NoError(t, <-done)
	t.Logf("%d of %d steps wholly in C; the last write seen %v", whole, steps, last)
	require.Positive(t, whole, "steps wholly in C")
	require.Greater(t, last, float32(200), "writes seen")
	require.Zero(t, w.o.Engine.Region().Stats().ReadersPinned, "no pin left")
}

// writtenStepper is a stepper with a plan stepping "c-0", "c-1" and "plain" at one site while
// the owner rewrites "c-0" (admitK: every element k).
type writtenStepper struct {
	t       *testing.T
	o       *steer.Owner
	cfg     steer.ModelConfig
	d       int
	L, site int32
	fast, b uint64
}

func newWrittenStepper(t *testing.T) *writtenStepper {
	o, cfg := planOwner(t)
	w := &writtenStepper{t: t, o: o, cfg: cfg, d: cfg.Hidden, L: int32(cfg.Layers)}
	w.site = 1*w.L + 2
	w.fast = probeStepper(o.Engine, true)
	t.Cleanup(func() { probeFree(w.fast) })
	w.b = probeBatch(w.fast, []int32{w.site})
	require.NotZero(t, w.b)
	return w
}

func (w *writtenStepper) admitK(k int) error {
	var s steer.Steering
	for hk := range w.cfg.NumHooks() {
		for l := range w.cfg.Layers {
			v := make([]float32, w.d)
			for i := range v {
				v[i] = float32(k)
			}
			s.Base.Vectors = append(s.Base.Vectors, steer.Vector{Hook: w.cfg.HookName(steer.HookID(hk)), Layer: l, Scale: 1, Data: v})
		}
	}
	_, err := w.o.Admit(steer.Admission{RequestID: "c-0", Override: &s})
	return err
}

// step runs a step at position pos through the plan first (between runs after its resolve)
// and returns the steered block (zeros before) and whether it began and ended in C.
func (w *writtenStepper) step(pos int, between func()) (block []float32, began, ended bool) {
	t := w.t
	spans := []steer.Span{{ID: "c-0", Start: 0, End: 1, Phase: steer.PhaseDecode, Pos: pos}, {ID: "c-1", Start: 1, End: 2, Phase: steer.PhaseDecode, Pos: pos}, {ID: "plain", Start: 2, End: 3, Phase: steer.PhaseDecode, Pos: pos}}
	cs := newCSpans(spans)
	defer cs.free()
	_, rc, began := probeResolveC(w.b, cs, 3)
	require.Zero(t, rc, "step %d", pos)
	if between != nil {
		between()
	}
	block = make([]float32, 3*w.d)
	rc, _ = probeApply(w.fast, uint32(w.site/w.L), w.site%w.L, unsafe.Pointer(&block[0]), len(block), false, cs)
	require.Zero(t, rc, "step %d", pos)
	_, rc, ended = probeEndC(w.fast)
	require.Zero(t, rc, "step %d", pos)
	return block, began, ended
}

// write rewrites "c-0" from k on, at random moments, reclaiming every third write, until stop.
func (w *writtenStepper) write(k int, stop <-chan struct{}, done chan<- error) {
	rng := rand.New(rand.NewPCG(11, 12))
	for ; ; k++ {
		select {
		case <-stop:
			done <- nil
			return
		default:
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Microsecond)
		if err := w.admitK(k); err != nil {
			done <- err
			return
		}
		if k%3 == 0 {
			if err := w.o.Engine.Region().Reclaim(); err != nil {
				done <- err
				return
			}
		}
	}
}
