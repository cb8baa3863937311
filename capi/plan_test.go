//go:build cgo && linux

package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// planOwner is an owner of a model of hidden 64 x 3 layers with a column pool of 4: requests
// c-0..c-2 in columns (runs of adjacent cells), "entry" in its entry (the pool is full),
// "clamped" with a clamp at pre_attn layer 1, "plain" unsteered, "other" (an id as long as
// "entry"), and a global decode vector at hook 2 layer 0 (pairs with the requests').
func planOwner(t *testing.T) (*steer.Owner, steer.ModelConfig) {
	cfg := steer.ModelConfig{Hidden: 64, Layers: 3}
	rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 1 << 12, ArenaBytes: 32 << 20, ReaderSlots: 64, Columns: 4})
	require.NoError(t, err)
	r, err := shm.Create(rc)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	o, err := steer.Open(r, &cfg, steer.Options{Logf: t.Logf})
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, id := range []string{"c-0", "c-1", "c-2", "entry", "clamped", "other"} {
		planAdmit(t, o, cfg, rng, id)
	}
	_, err = o.Admit(steer.Admission{RequestID: "plain"})
	require.NoError(t, err)
	var g steer.Steering
	g.Decode.Vectors = []steer.Vector{{Hook: cfg.HookName(2), Layer: 0, Scale: 1, Data: planVec(rng, cfg.Hidden)}}
	_, err = o.SetGlobal(g)
	require.NoError(t, err)
	return o, cfg
}

func planVec(rng *rand.Rand, d int) []float32 {
	v := make([]float32, d)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// planAdmit admits id with a random vector at every site (base tier; "clamped" adds a clamp).
func planAdmit(t *testing.T, o *steer.Owner, cfg steer.ModelConfig, rng *rand.Rand, id string) {
	var s steer.Steering
	for hk := range cfg.NumHooks() {
		for l := range cfg.Layers {
			s.Base.Vectors = append(s.Base.Vectors, steer.Vector{Hook: cfg.HookName(steer.HookID(hk)), Layer: l, Scale: 1, Data: planVec(rng, cfg.Hidden)})
		}
	}
	if id == "clamped" {
		dir := make([]float32, cfg.Hidden)
		dir[0] = 1
		s.Base.Clamps = []steer.Clamp{{Hook: "pre_attn", Layer: 1, Dir: dir, Min: -0.5, Max: 0.5, Strength: 1}}
	}
	_, err := o.Admit(steer.Admission{RequestID: id, Override: &s})
	require.NoError(t, err)
}

// planBlock is rows x d random values: float32, or bfloat16 bytes (bf16).
func planBlock(rng *rand.Rand, n int, bf16 bool) []byte {
	if !bf16 {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(rng.NormFloat64())))
		}
		return b
	}
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(math.Float32bits(float32(rng.NormFloat64()))>>16))
	}
	return b
}

// TestPlanMatchesGo steps the same batches through two steppers of one engine: one whose plain
// sites run in C (plan.c), one without a plan (every apply in Go). Float32 and bfloat16: the
// same bytes at every site, the same checksums and counts; from a batch's second step on, the
// plain sites run in C and the clamped one in Go; a batch whose only change is its positions
// stays in C; a request admitted again (a new program), spans of other rows, a span's id
// rewritten in place (the same pointer) and a block too short for the batch all leave C and
// give Go's answer.
func TestPlanMatchesGo(t *testing.T) {
	for _, bf16 := range []bool{false, true} {
		t.Run(fmt.Sprint("bf16=", bf16), func(t *testing.T) { testPlanMatchesGo(t, bf16) })
	}
}

func testPlanMatchesGo(t *testing.T, bf16 bool) {
	o, cfg := planOwner(t)
	d, elem := cfg.Hidden, 4
	if bf16 {
		elem = 2
	}
	ref, fast := probeStepper(o.Engine, false), probeStepper(o.Engine, true)
	defer probeFree(ref)
	defer probeFree(fast)
	decode := func(pos int, ids ...string) []steer.Span {
		var b []steer.Span
		for i, id := range ids {
			b = append(b, steer.Span{ID: id, Start: i, End: i + 1, Phase: steer.PhaseDecode, Pos: 10 + pos})
		}
		return b
	}
	ids := []string{"c-0", "c-1", "c-2", "entry", "clamped", "plain"}
	type step struct {
		spans  []steer.Span
		before func(*cSpans) // after site (1, 0), a plain one before a plain one
		inC    bool          // its plain sites run in C after the first site
	}
	rng := rand.New(rand.NewPCG(1, 2))
	steps := []step{
		{spans: decode(0, ids...)},
		{spans: decode(0, ids...), inC: true},
		{spans: decode(1, ids...), inC: true}, // positions advance
		{spans: decode(2, ids...), inC: true},
		{spans: decode(3, ids...), before: func(*cSpans) { planAdmit(t, o, cfg, rng, "c-1") }}, // the version of the step is pinned: still C
		{spans: decode(4, ids...)}, // the new composition: a new program
		{spans: decode(5, ids...), inC: true},
		{spans: []steer.Span{{ID: "c-2", Start: 0, End: 3, Phase: steer.PhasePrefill}, {ID: "c-0", Start: 3, End: 4, Phase: steer.PhaseDecode}, {ID: "entry", Start: 5, End: 7, Phase: steer.PhasePrefill}}},
		{spans: decode(6, ids...)},
		{spans: decode(7, ids...), inC: true, before: func(c *cSpans) { c.setID(3, "other") }},
	}
	rows := 8
	sawC, sawGo := 0, 0
	for si, stp := range steps {
		what := fmt.Sprintf("step %d", si)
		cs := newCSpans(stp.spans)
		require.Zero(t, probeBegin(ref), what)
		require.Zero(t, probeBegin(fast), what)
		first := true
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				where := fmt.Sprintf("%s site %d/%d", what, hk, l)
				want := planBlock(rng, rows*d, bf16)
				got := slices.Clone(want)
				n := len(want) / elem
				rcRef, refC := probeApply(ref, uint32(hk), int32(l), unsafe.Pointer(&want[0]), n, bf16, cs)
				rc, inC := probeApply(fast, uint32(hk), int32(l), unsafe.Pointer(&got[0]), n, bf16, cs)
				require.Zero(t, rcRef, where)
				require.Zero(t, rc, where)
				require.False(t, refC, where)
				require.Equal(t, want, got, where)
				clamped := hk == 0 && l == 1
				switch {
				case first || clamped:
					require.False(t, inC, where)
				case stp.inC:
					require.True(t, inC, where)
				}
				if inC {
					sawC++
				} else {
					sawGo++
				}
				if hk == 1 && l == 0 && stp.before != nil {
					stp.before(cs)
					if si == len(steps)-1 {
						stp.inC = false // the id changed under the same pointer: Go again
					}
				}
				first = false
			}
		}
		// A block shorter than the batch's rows: Go's refusal, from both.
		short := make([]byte, elem*d)
		rcRef, _ := probeApply(ref, 1, 0, unsafe.Pointer(&short[0]), d, bf16, cs)
		rc, inC := probeApply(fast, 1, 0, unsafe.Pointer(&short[0]), d, bf16, cs)
		require.NotZero(t, rc, what)
		require.Equal(t, rcRef, rc, what)
		require.False(t, inC, what)
		sumRef, rcRef := probeEnd(ref)
		sum, rc := probeEnd(fast)
		require.Zero(t, rcRef)
		require.Zero(t, rc)
		require.Equal(t, sumRef, sum, "%s checksum", what)
		a, b := probeStats(ref), probeStats(fast)
		require.Equal(t, a.Applies, b.Applies, what)
		require.Equal(t, a.ColumnRuns, b.ColumnRuns, what)
		require.Equal(t, a.RunRows, b.RunRows, what)
		cs.free()
	}
	require.Greater(t, sawC, 4*cfg.NumHooks()*cfg.Layers, "plain sites ran in C")
	require.Positive(t, probeStats(fast).ColumnRuns, "runs of pool cells")
	t.Logf("C applies %d, Go applies %d", sawC, sawGo)
}

// TestPlanNativeResolveExportsSites steps batches through native resolves (SHMSTEER_BATCH_NATIVE)
// on a stepper with a plan and one without, the batches restricted to some sites: each new
// batch's plain sites among them run in C from the step's first apply (the resolve handed them
// to the plan), a site outside them goes to Go at its first apply of a program and to C after,
// a site with a clamped span stays in Go; the bytes, the batch and step checksums and the
// counts equal the stepper's without a plan.
func TestPlanNativeResolveExportsSites(t *testing.T) {
	for _, bf16 := range []bool{false, true} {
		t.Run(fmt.Sprint("bf16=", bf16), func(t *testing.T) { testPlanNativeResolve(t, bf16) })
	}
}

func testPlanNativeResolve(t *testing.T, bf16 bool) {
	o, cfg := planOwner(t)
	d, elem := cfg.Hidden, 4
	if bf16 {
		elem = 2
	}
	L := int32(cfg.Layers)
	attached := []int32{2*L + 0, 1*L + 2, 0*L + 1, 4*L + 1} // (2,0) pairs with the global vector; (0,1) clamps "clamped"
	outside := 3*L + 2
	ref, fast, bRef, bFast := planSteppers(t, o, attached)
	decode := func(pos int, ids ...string) []steer.Span {
		var b []steer.Span
		for i, id := range ids {
			b = append(b, steer.Span{ID: id, Start: i, End: i + 1, Phase: steer.PhaseDecode, Pos: 10 + pos})
		}
		return b
	}
	all := []string{"c-0", "c-1", "c-2", "entry", "clamped", "plain"}
	mixed := []steer.Span{{ID: "c-2", Start: 0, End: 3, Phase: steer.PhasePrefill}, {ID: "c-0", Start: 3, End: 4, Phase: steer.PhaseDecode}, {ID: "entry", Start: 5, End: 7, Phase: steer.PhasePrefill}}
	steps := [][]steer.Span{decode(0, all...), decode(1, all...), mixed, decode(2, "entry", "c-1", "c-0"), decode(3, "entry", "c-1", "c-0"), decode(4, all...)}
	rng := rand.New(rand.NewPCG(3, 4))
	rows := 8
	var outsideGo, outsideC int
	for si, spans := range steps {
		what := fmt.Sprintf("step %d", si)
		cs := newCSpans(spans)
		sumRef, rcRef := probeResolveNative(bRef, cs, rows)
		sum, rc := probeResolveNative(bFast, cs, rows)
		require.Zero(t, rcRef, what)
		require.Zero(t, rc, what)
		require.Equal(t, sumRef, sum, "%s batch checksum", what)
		clamped := slices.ContainsFunc(spans, func(s steer.Span) bool { return s.ID == "clamped" })
		for _, site := range append([]int32{outside}, attached...) {
			hk, l := uint32(site/L), site%L
			where := fmt.Sprintf("%s site %d/%d", what, hk, l)
			for rep := range 2 { // a site applied twice in a step (a model calling a module twice)
				want := planBlock(rng, rows*d, bf16)
				got := slices.Clone(want)
				n := len(want) / elem
				rcRef, refC := probeApply(ref, hk, l, unsafe.Pointer(&want[0]), n, bf16, cs)
				rc, inC := probeApply(fast, hk, l, unsafe.Pointer(&got[0]), n, bf16, cs)
				require.Zero(t, rcRef, where)
				require.Zero(t, rc, where)
				require.False(t, refC, where)
				require.Equal(t, want, got, where)
				switch {
				case site == 0*L+1 && clamped:
					require.False(t, inC, "%s: a clamped span's site stays in Go", where)
				case site == outside && rep == 0:
					if inC {
						outsideC++
					} else {
						outsideGo++
					}
				default:
					require.True(t, inC, "%s (apply %d): plain, in C from the step's first apply", where, rep)
				}
			}
		}
		stepRef, rcRef := probeEnd(ref)
		step, rc := probeEnd(fast)
		require.Zero(t, rcRef)
		require.Zero(t, rc)
		require.Equal(t, stepRef, step, "%s step checksum", what)
		a, b := probeStats(ref), probeStats(fast)
		require.Equal(t, a.Applies, b.Applies, what)
		require.Equal(t, a.ColumnRuns, b.ColumnRuns, what)
		require.Equal(t, a.RunRows, b.RunRows, what)
		cs.free()
	}
	// Steps 1 and 4 keep their predecessor's program: the outside site's exported apply holds.
	require.Equal(t, 4, outsideGo, "the outside site goes to Go at each new program")
	require.Equal(t, 2, outsideC, "and stays in C while the program holds")

	// Sites added between steps of one program are handed to the plan at the next resolve.
	added := int32(3*L + 0)
	var sites []int32
	for _, s := range append(slices.Clone(attached), added) {
		if s != 0*L+1 {
			sites = append(sites, s)
		}
	}
	require.Zero(t, probeSetSites(bFast, sites))
	cs := newCSpans(decode(5, all...))
	defer cs.free()
	_, rc := probeResolveNative(bFast, cs, rows)
	require.Zero(t, rc)
	block := planBlock(rng, rows*d, bf16)
	rc, inC := probeApply(fast, uint32(added/L), added%L, unsafe.Pointer(&block[0]), len(block)/elem, bf16, cs)
	require.Zero(t, rc)
	require.True(t, inC, "a site added to the batch runs in C from its first apply")
	_, rc = probeEnd(fast)
	require.Zero(t, rc)
}

// TestPlanNativeEndInC ends native steps through the plan first, as shmsteer_stepper_end does,
// on a stepper with a plan and one without: a native step whose every apply ran in C ends in
// C (its pin word zeroed, Go's step still open until its next call) when its sites are the last
// Go-ended step's of the same program, in the same order, or, in a new program, those of the
// last end C could make (at first the batch's sites), in their order; a step with a Go apply or
// other sites ends in Go. The bytes, the checksums and the counts equal the stepper's
// without a plan at every step, and an owner write between steps that keeps the program
// changes nothing of that.
func TestPlanNativeEndInC(t *testing.T) {
	for _, bf16 := range []bool{false, true} {
		t.Run(fmt.Sprint("bf16=", bf16), func(t *testing.T) { testPlanNativeEnd(t, bf16) })
	}
}

func testPlanNativeEnd(t *testing.T, bf16 bool) {
	o, cfg := planOwner(t)
	d, elem := cfg.Hidden, 4
	if bf16 {
		elem = 2
	}
	L := int32(cfg.Layers)
	attached := []int32{2*L + 0, 1*L + 2, 4*L + 1}
	outside := 3*L + 2
	ref, fast, bRef, bFast := planSteppers(t, o, attached)
	ids := []string{"c-0", "entry", "c-2", "plain", "clamped"}
	clampSite := 0*L + 1 // "clamped"'s clamp: never plain, always Go
	decode := func(pos int) []steer.Span {
		var b []steer.Span
		for i, id := range ids {
			b = append(b, steer.Span{ID: id, Start: i, End: i + 1, Phase: steer.PhaseDecode, Pos: 10 + pos})
		}
		return b
	}
	rng := rand.New(rand.NewPCG(7, 8))
	type step struct {
		sites  []int32
		before func() // between the resolve and the applies' end, after the previous step
		inC    bool   // ends in C
	}
	late := func() {
		_, err := o.Admit(steer.Admission{RequestID: "late"}) // a new version, the same program
		require.NoError(t, err)
	}
	readmit := func() { planAdmit(t, o, cfg, rng, "c-0") } // a new composition: a new program
	reversed := []int32{attached[2], attached[1], attached[0]}
	steps := []step{
		{sites: attached, inC: true}, // a new program: the resolve armed the batch's sites
		{sites: attached, inC: true}, // positions advance
		{sites: attached, inC: true}, // again
		{sites: attached, before: late, inC: true},
		{sites: attached[:2]},                                     // other sites: Go (arms for these)
		{sites: attached},                                         // other again: Go
		{sites: attached, inC: true},                              // C
		{sites: append([]int32{clampSite}, attached...)},          // a Go apply, then the armed sites in C: Go
		{sites: attached, inC: true},                              // C
		{sites: attached, before: readmit, inC: true},             // the same sites in a new program: armed at the resolve
		{sites: attached, inC: true},                              // C
		{sites: reversed},                                         // the same sites in another order: Go
		{sites: attached},                                         // and back: Go
		{sites: attached, inC: true},                              // C
		{sites: append([]int32{outside}, attached...)},            // the outside site's first apply is Go's, before the C ones: Go
		{sites: append([]int32{outside}, attached...)},            // every apply in C, but not armed for it yet: Go
		{sites: append([]int32{outside}, attached...), inC: true}, // C
		{sites: reversed, before: readmit},                        // a new program, armed for the last order: Go
		{sites: reversed, inC: true},                              // Go's end armed this order: C
		{sites: attached, before: readmit},                        // a new program armed for that order: Go
		{sites: attached, inC: true},                              // C
	}
	rows := 6
	for si, stp := range steps {
		what := fmt.Sprintf("step %d", si)
		if stp.before != nil {
			stp.before()
		}
		cs := newCSpans(decode(si))
		sumRef, rcRef := probeResolveNative(bRef, cs, rows)
		sum, rc := probeResolveNative(bFast, cs, rows)
		require.Zero(t, rcRef, what)
		require.Zero(t, rc, what)
		require.Equal(t, sumRef, sum, "%s batch checksum", what)
		for _, site := range stp.sites {
			hk, l := uint32(site/L), site%L
			want := planBlock(rng, rows*d, bf16)
			got := slices.Clone(want)
			n := len(want) / elem
			rcRef, _ := probeApply(ref, hk, l, unsafe.Pointer(&want[0]), n, bf16, cs)
			rc, _ := probeApply(fast, hk, l, unsafe.Pointer(&got[0]), n, bf16, cs)
			require.Zero(t, rcRef, what)
			require.Zero(t, rc, what)
			require.Equal(t, want, got, "%s site %d", what, site)
		}
		pin, open := probePin(fast)
		require.True(t, open, what)
		require.NotZero(t, pin, "%s: the step is pinned", what)
		stepRef, rcRef := probeEnd(ref)
		step, rc, inC := probeEndC(fast)
		require.Zero(t, rcRef, what)
		require.Zero(t, rc, what)
		require.Equal(t, stp.inC, inC, "%s ends in C", what)
		require.Equal(t, stepRef, step, "%s step checksum", what)
		pin, open = probePin(fast)
		if inC {
			require.True(t, open, "%s: Go ends the step at its next call", what)
			require.Zero(t, pin, "%s: C released the pin", what)
		} else {
			require.False(t, open, what)
		}
		a, b := probeStats(ref), probeStats(fast) // settles fast: Go ends what C ended
		require.Equal(t, a, b, what)
		_, open = probePin(fast)
		require.False(t, open, "%s: ended in Go after its next call", what)
		cs.free()
	}
}

// planSteppers makes a stepper without a plan (ref) and one with (fast) on o's engine, each
// with a batch restricted to sites; freed when the test ends.
func planSteppers(t *testing.T, o *steer.Owner, sites []int32) (ref, fast, bRef, bFast uint64) {
	ref, fast = probeStepper(o.Engine, false), probeStepper(o.Engine, true)
	t.Cleanup(func() { probeFree(ref); probeFree(fast) })
	bRef, bFast = probeBatch(ref, sites), probeBatch(fast, sites)
	require.NotZero(t, bRef)
	require.NotZero(t, bFast)
	return ref, fast, bRef, bFast
}
