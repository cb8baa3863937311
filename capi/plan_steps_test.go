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
// applies, end), against a stepper without a plan that Go runs: once a native resolve armed it
// and a step ended in C, the next steps of the same batch (positions advanced) begin and end in
// C without Go, holding the version's pin from begin to end; an owner write, a Go call in the
// middle of a step C began (which Go then takes over), other sites at the end, and a freed
// batch leave C. At every step the bytes, the batch and step checksums and, once Go counts
// what C did, every counter equal the stepper's without a plan.
func TestPlanNativeStepsInC(t *testing.T) {
	for _, bf16 := range []bool{false, true} {
		t.Run(fmt.Sprint("bf16=", bf16), func(t *testing.T) { testPlanNativeSteps(t, bf16) })
	}
}

func testPlanNativeSteps(t *testing.T, bf16 bool) {
	o, cfg := planOwner(t)
	region := o.Engine.Region()
	d, elem := cfg.Hidden, 4
	if bf16 {
		elem = 2
	}
	L := int32(cfg.Layers)
	attached := []int32{2*L + 0, 1*L + 2, 4*L + 1}
	ref, fast := probeStepper(o.Engine, false), probeStepper(o.Engine, true)
	defer probeFree(ref)
	defer probeFree(fast)
	bRef, bFast := probeBatch(ref, attached), probeBatch(fast, attached)
	require.NotZero(t, bRef)
	require.NotZero(t, bFast)
	ids := []string{"c-0", "entry", "c-2", "plain"}
	rows := 5
	rng := rand.New(rand.NewPCG(9, 10))
	type step struct {
		sites        []int32
		late         bool // an owner write before it
		statsMid     bool // a Go call (stats) between its resolve and its applies
		pad          int  // rows past the spans' (a padded block)
		swap         bool // two requests' rows exchanged (ids of the same length)
		begin, endIn bool // begins in C, ends in C
	}
	steps := []step{
		{sites: attached}, // Go: a new program; Go's resolve arms C's begin
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
		{sites: attached, swap: true},                           // other ids in the rows: Go, a new program
		{sites: attached, swap: true, begin: true, endIn: true}, // Go's end armed both
		{sites: attached, swap: true, begin: true, endIn: true},
		{sites: attached},                      // swapped back: Go, a new program
		{sites: attached, pad: 2, endIn: true}, // a block of other rows: Go begins
		{sites: attached, pad: 2, begin: true, endIn: true},
	}
	for si, stp := range steps {
		what := fmt.Sprintf("step %d", si)
		if stp.late {
			_, err := o.Admit(steer.Admission{RequestID: fmt.Sprint("late-", si)})
			require.NoError(t, err)
		}
		var spans []steer.Span
		order := ids
		if stp.swap {
			order = []string{ids[2], ids[1], ids[0], ids[3]}
		}
		for i, id := range order {
			spans = append(spans, steer.Span{ID: id, Start: i, End: i + 1, Phase: steer.PhaseDecode, Pos: 20 + si})
		}
		cs := newCSpans(spans)
		rows := rows + stp.pad
		sumRef, rcRef := probeResolveNative(bRef, cs, rows)
		sum, rc, inC := probeResolveC(bFast, cs, rows)
		require.Zero(t, rcRef, what)
		require.Zero(t, rc, what)
		require.Equal(t, stp.begin, inC, "%s begins in C", what)
		require.Equal(t, sumRef, sum, "%s batch checksum", what)
		if inC {
			require.EqualValues(t, 2, region.Stats().ReadersPinned, "%s: both steps pinned, C's too", what)
		}
		if stp.statsMid {
			require.Equal(t, probeStats(ref).Steps, probeStats(fast).Steps, what)
		}
		for _, site := range stp.sites {
			want := planBlock(rng, rows*d, bf16)
			got := slices.Clone(want)
			rcRef, _ := probeApply(ref, uint32(site/L), site%L, unsafe.Pointer(&want[0]), len(want)/elem, bf16, cs)
			rc, _ := probeApply(fast, uint32(site/L), site%L, unsafe.Pointer(&got[0]), len(got)/elem, bf16, cs)
			require.Zero(t, rcRef, what)
			require.Zero(t, rc, what)
			require.Equal(t, want, got, "%s site %d", what, site)
		}
		stepRef, rcRef := probeEnd(ref)
		step, rc, endC := probeEndC(fast)
		require.Zero(t, rcRef, what)
		require.Zero(t, rc, what)
		require.Equal(t, stp.endIn, endC, "%s ends in C", what)
		require.Equal(t, stepRef, step, "%s step checksum", what)
		require.Zero(t, region.Stats().ReadersPinned, "%s: no pin left after the end", what)
		cs.free()
	}
	// Fewer rows than the spans reach: Go's refusal, not C's begin.
	short := newCSpans([]steer.Span{{ID: "c-0", Start: 0, End: 1, Phase: steer.PhaseDecode, Pos: 98}, {ID: "entry", Start: 1, End: 2, Phase: steer.PhaseDecode, Pos: 98}, {ID: "c-2", Start: 2, End: 3, Phase: steer.PhaseDecode, Pos: 98}, {ID: "plain", Start: 3, End: 4, Phase: steer.PhaseDecode, Pos: 98}})
	_, rcRef := probeResolveNative(bRef, short, 2)
	_, rc, inC := probeResolveC(bFast, short, 2)
	require.NotZero(t, rc, "rows short of the spans")
	require.Equal(t, rcRef, rc)
	require.False(t, inC)
	short.free()
	require.Equal(t, probeStats(ref), probeStats(fast), "every counter, once Go counted C's steps")
	// A batch freed after a step C began: Go takes it over, then the batch goes.
	cs := newCSpans([]steer.Span{{ID: "c-0", Start: 0, End: 1, Phase: steer.PhaseDecode, Pos: 99}, {ID: "entry", Start: 1, End: 2, Phase: steer.PhaseDecode, Pos: 99}, {ID: "c-2", Start: 2, End: 3, Phase: steer.PhaseDecode, Pos: 99}, {ID: "plain", Start: 3, End: 4, Phase: steer.PhaseDecode, Pos: 99}})
	defer cs.free()
	applyAll := func() {
		for _, site := range attached {
			block := planBlock(rng, rows*d, bf16)
			rc, _ := probeApply(fast, uint32(site/L), site%L, unsafe.Pointer(&block[0]), len(block)/elem, bf16, cs)
			require.Zero(t, rc)
		}
	}
	_, rc, inC = probeResolveC(bFast, cs, rows) // the refusal disarmed C's begin: Go
	require.Zero(t, rc)
	require.False(t, inC)
	applyAll()
	_, rc, inC = probeEndC(fast)
	require.Zero(t, rc)
	require.True(t, inC, "the armed end: C")
	_, rc, inC = probeResolveC(bFast, cs, rows)
	require.Zero(t, rc)
	require.True(t, inC, "the batch's next step begins in C")
	applyAll()
	require.Zero(t, probeBatchFree(bFast))
	_, rc, inC = probeResolveC(bFast, cs, rows)
	require.NotZero(t, rc, "a freed batch")
	require.False(t, inC)
	_, rc, _ = probeEndC(fast)
	require.Zero(t, rc)
	require.Zero(t, region.Stats().ReadersPinned, "no pin left")
}

// TestPlanStepsUnderWrites steps a steady batch through the plan (begin, apply, end; in C
// whenever the version holds) while an owner goroutine rewrites request "c-0"'s steering at
// random moments (every element of the k-th write is k) and reclaims: the row "c-0" gets is
// always one whole written vector, never a mix of two or a reused cell, and k never goes back;
// the other rows get their unchanging steering; some steps ran wholly in C; no pin is left.
func TestPlanStepsUnderWrites(t *testing.T) {
	o, cfg := planOwner(t)
	d, L := cfg.Hidden, int32(cfg.Layers)
	site := 1*L + 2
	fast := probeStepper(o.Engine, true)
	defer probeFree(fast)
	b := probeBatch(fast, []int32{site})
	require.NotZero(t, b)
	admitK := func(k int) error {
		var s steer.Steering
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				v := make([]float32, d)
				for i := range v {
					v[i] = float32(k)
				}
				s.Base.Vectors = append(s.Base.Vectors, steer.Vector{Hook: cfg.HookName(steer.HookID(hk)), Layer: l, Scale: 1, Data: v})
			}
		}
		_, err := o.Admit(steer.Admission{RequestID: "c-0", Override: &s})
		return err
	}
	require.NoError(t, admitK(1))
	// A step C began keeps its version while the owner writes and reclaims under it.
	step := func(pos int, between func()) (k float32, began bool) {
		spans := []steer.Span{{ID: "c-0", Start: 0, End: 1, Phase: steer.PhaseDecode, Pos: pos}, {ID: "c-1", Start: 1, End: 2, Phase: steer.PhaseDecode, Pos: pos}, {ID: "plain", Start: 2, End: 3, Phase: steer.PhaseDecode, Pos: pos}}
		cs := newCSpans(spans)
		defer cs.free()
		_, rc, began := probeResolveC(b, cs, 3)
		require.Zero(t, rc)
		if between != nil {
			between()
		}
		block := make([]float32, 3*d)
		rc, _ = probeApply(fast, uint32(site/L), site%L, unsafe.Pointer(&block[0]), len(block), false, cs)
		require.Zero(t, rc)
		_, rc, _ = probeEndC(fast)
		require.Zero(t, rc)
		return block[0], began
	}
	step(0, nil) // Go arms
	k, began := step(1, nil)
	require.True(t, began)
	require.Equal(t, float32(1), k)
	k, began = step(2, func() {
		for w := 100; w < 104; w++ {
			require.NoError(t, admitK(w))
			require.NoError(t, o.Engine.Region().Reclaim())
		}
	})
	require.True(t, began)
	require.Equal(t, float32(1), k, "the version C pinned: its cells were not reclaimed")
	k, began = step(3, nil)
	require.False(t, began, "a new version: Go")
	require.Equal(t, float32(103), k)
	stop, done := make(chan struct{}), make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(11, 12))
		for k := 200; ; k++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			time.Sleep(time.Duration(rng.IntN(400)) * time.Microsecond)
			if err := admitK(k); err != nil {
				done <- err
				return
			}
			if k%3 == 0 {
				if err := o.Engine.Region().Reclaim(); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	var row1 []float32
	last, whole := float32(103), 0
	steps := 3000
	if testing.Short() {
		steps = 800
	}
	for step := range steps {
		spans := []steer.Span{{ID: "c-0", Start: 0, End: 1, Phase: steer.PhaseDecode, Pos: step}, {ID: "c-1", Start: 1, End: 2, Phase: steer.PhaseDecode, Pos: step}, {ID: "plain", Start: 2, End: 3, Phase: steer.PhaseDecode, Pos: step}}
		cs := newCSpans(spans)
		_, rc, began := probeResolveC(b, cs, 3)
		require.Zero(t, rc, "step %d", step)
		block := make([]float32, 3*d)
		rc, _ = probeApply(fast, uint32(site/L), site%L, unsafe.Pointer(&block[0]), len(block), false, cs)
		require.Zero(t, rc, "step %d", step)
		_, rc, ended := probeEndC(fast)
		require.Zero(t, rc, "step %d", step)
		cs.free()
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
	require.Zero(t, o.Engine.Region().Stats().ReadersPinned, "no pin left")
}
