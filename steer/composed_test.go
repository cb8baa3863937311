package steer

import (
	"fmt"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// inside reports whether v's data lies within b's.
func inside(v []float32, b []byte) bool {
	p, lo := reflect.ValueOf(v).Pointer(), reflect.ValueOf(b).Pointer()
	return p >= lo && p+uintptr(4*len(v)) <= lo+uintptr(len(b))
}

// TestComposedInPlace: the vectors a Stepper adds are the owner's compositions read in place
// (they alias the region's entry: no worker keeps a copy), a global change makes a Stepper
// re-read one entry rather than recompose every request, and a named vector's change
// recomposes the requests that reference it in the same version.
func TestComposedInPlace(t *testing.T) {
	d := smallCfg.Hidden
	e := newOwner(t, smallCfg, Options{})
	_, err := e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(d, 1)}})
	require.NoError(t, err)
	var batch []Span
	for i := 0; i < 8; i++ {
		id := fmt.Sprintf("r%d", i)
		s := Steering{Decode: Tier{Refs: []Ref{{Name: "n", Strength: float32(i + 1)}},
			Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: filled(d, float32(i))}}}}
		_, err := e.Admit(Admission{RequestID: id, Override: &s})
		require.NoError(t, err)
		batch = append(batch, Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode})
	}
	st := e.NewStepper()
	defer st.Close()
	h := make([]float32, 8*d)
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(3, 2, h, batch))
	mlpIn := (3*smallCfg.Layers+2)*2 + int(PhaseDecode) - 1
	named, _, err := st.snap.View(KindVector, "n")
	require.NoError(t, err)
	for i, sp := range batch {
		raw, _, err := st.snap.View(KindComposed, sp.ID)
		require.NoError(t, err)
		v, _, act := st.cur[i].view.at(mlpIn)
		require.NotZero(t, act)
		if i == 0 { // strength 1: the named vector's own floats, in place
			require.True(t, inside(v, named), "request %s reads the named vector in place", sp.ID)
		} else { // composed: the request's own vector, in its column of the region's pool
			require.True(t, inCell(v, &st.cur[i].view, mlpIn/2), "request %s's vector is its cell of the column pool", sp.ID)
		}
		_ = raw
		require.Equal(t, float32(i+1), h[i*d])
	}
	st.End()
	before := st.Stats().Recomposes

	_, err = e.SetGlobal(Steering{Decode: Tier{Vectors: []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(d, 100)}}}})
	require.NoError(t, err)
	clear(h)
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(3, 2, h, batch))
	st.End()
	require.Equal(t, before+1, st.Stats().Recomposes, "a global change: one entry re-read, no request recomposed")
	require.Equal(t, float32(101), h[0])

	v0 := e.Region().Version()
	info, err := e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(d, 10)}})
	require.NoError(t, err)
	require.Equal(t, v0+1, info.Version, "the vector and its dependents' compositions in one version")
	clear(h)
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(3, 2, h, batch))
	st.End()
	for i := range batch {
		require.Equal(t, float32(100+10*(i+1)), h[i*d], "request %d sees the new vector", i)
	}
	_, err = e.Unregister("n")
	require.NoError(t, err)
	clear(h)
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(3, 2, h, batch))
	st.End()
	require.Equal(t, float32(100), h[0], "an unregistered reference stops applying")
	require.NotZero(t, st.Stats().MissingRefs)

	// End drops both entries; the id is then unknown to a step.
	_, err = e.End("r0")
	require.NoError(t, err)
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(3, 2, h, batch[:1]))
	st.End()
	require.NotZero(t, st.Stats().UnknownRequests)
}

// TestStatusOldestPin: Status names the reader that holds reclamation back.
func TestStatusOldestPin(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	st, err := e.Status()
	require.NoError(t, err)
	require.Nil(t, st.OldestPin)
	snap, err := e.Region().Snapshot()
	require.NoError(t, err)
	defer snap.Close()
	_, err = e.Region().SweepReaders() // the owner's periodic scan notes the pin
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	st, err = e.Status()
	require.NoError(t, err)
	require.NotNil(t, st.OldestPin)
	require.Equal(t, os.Getpid(), st.OldestPin.PID)
	require.Equal(t, snap.Version(), st.OldestPin.Version)
	require.Greater(t, st.OldestPin.AgeSeconds, 0.015)
}

// TestComposedSharesPhases: base-tier vectors apply to both phases, and their composition
// stores them once, not once per phase.
func TestComposedSharesPhases(t *testing.T) {
	d := smallCfg.Hidden
	e := newOwner(t, smallCfg, Options{})
	var s Steering
	for l := 0; l < smallCfg.Layers; l++ { // scale 2: composed (scaled), so stored
		s.Base.Vectors = append(s.Base.Vectors, Vector{Hook: "post_block", Layer: l, Scale: 2, Data: filled(d, float32(l+1))})
	}
	s.Decode.Vectors = []Vector{{Hook: "post_block", Layer: 0, Scale: 1, Data: filled(d, 10)}} // one phase differs
	_, err := e.Admit(Admission{RequestID: "r", Override: &s})
	require.NoError(t, err)
	snap, err := e.Region().Snapshot()
	require.NoError(t, err)
	defer snap.Close()
	v, err := openComposed(&snap, smallCfg, e.pool, KindComposed, "r", KindRequest)
	require.NoError(t, err)
	require.Zero(t, v.nvec, "the request's vectors are in columns, not its entry")
	require.Equal(t, 2, v.ncols, "one column, and a second for layer 0's decode vector")
	hook := 2 // post_block
	for l := 0; l < smallCfg.Layers; l++ {
		ix := (hook*smallCfg.Layers + l) * 2
		pre, _, _ := v.at(ix)
		dec, _, _ := v.at(ix + 1)
		require.Equal(t, float32(2*(l+1)), pre[0])
		if l == 0 {
			require.Equal(t, float32(12), dec[0])
		} else {
			require.Equal(t, reflect.ValueOf(pre).Pointer(), reflect.ValueOf(dec).Pointer(), "layer %d: one vector for both phases", l)
		}
	}
}

// TestComposedInPlaceTerms: a site whose composition is one term at coefficient 1 (a reference
// at strength 1, an inline vector at scale 1) stores nothing: steps read the named vector's
// floats, or the request's own, in place. A request referencing a named vector then costs a
// few bytes per site instead of a copy, and still follows the vector when it is re-registered.
func TestComposedInPlaceTerms(t *testing.T) {
	d := smallCfg.Hidden
	e := newOwner(t, smallCfg, Options{})
	var big []Vector
	for l := 0; l < smallCfg.Layers; l++ {
		for _, hk := range []string{"pre_attn", "mlp_out"} {
			big = append(big, Vector{Hook: hk, Layer: l, Scale: 1, Data: filled(d, float32(10*l+1))})
		}
	}
	_, err := e.Register("big", big)
	require.NoError(t, err)
	s := Steering{Base: Tier{Refs: []Ref{{Name: "big", Strength: 1}}},
		Decode: Tier{Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: filled(d, 7)}}}}
	var batch []Span
	for i := 0; i < 4; i++ {
		id := fmt.Sprintf("r%d", i)
		_, err := e.Admit(Admission{RequestID: id, Override: &s})
		require.NoError(t, err)
		batch = append(batch, Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode})
	}
	snap, err := e.Region().Snapshot()
	require.NoError(t, err)
	comp, _, err := snap.View(KindComposed, "r0")
	require.NoError(t, err)
	named, _, err := snap.View(KindVector, "big")
	require.NoError(t, err)
	raw, _, err := snap.View(KindRequest, "r0")
	require.NoError(t, err)
	v, err := openComposed(&snap, smallCfg, e.pool, KindComposed, "r0", KindRequest)
	require.NoError(t, err)
	require.Zero(t, v.nvec, "no vector stored: every site reads a term in place")
	sites := smallCfg.NumHooks() * smallCfg.Layers * 2
	require.Equal(t, int(roundUp64(uint64(hdrSize+sites*siteEntry+len(v.terms)+4*v.ncols))), len(comp), "header, site table, term records and the column list only")
	pre, _, _ := v.at((0*smallCfg.Layers+2)*2 + 1) // pre_attn, layer 2, decode
	require.True(t, inside(pre, named), "read in place in the named vector")
	own, _, _ := v.at((2*smallCfg.Layers+1)*2 + 1) // post_block, layer 1, decode
	require.False(t, inside(own, raw), "the request's own vector is copied out of its entry")
	require.True(t, inCell(own, &v, 2*smallCfg.Layers+1), "into its column of the pool, site by site")
	snap.Close()

	st := e.NewStepper()
	defer st.Close()
	h := make([]float32, 4*d)
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(0, 2, h, batch))
	st.End()
	require.Equal(t, float32(21), h[0])
	// Re-registering the vector recomposes its dependents in the same version: the next step
	// reads the new floats, through a view that names them.
	for i := range big {
		big[i].Data = filled(d, 100)
	}
	_, err = e.Register("big", big)
	require.NoError(t, err)
	clear(h)
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(0, 2, h, batch))
	st.End()
	for i := range batch {
		require.Equal(t, float32(100), h[i*d], "request %d follows the re-registered vector", i)
	}
	_, err = e.Unregister("big")
	require.NoError(t, err)
	clear(h)
	require.NoError(t, st.Begin(0))
	require.NoError(t, st.Apply(0, 2, h, batch))
	require.NoError(t, st.Apply(2, 1, h, batch))
	st.End()
	require.Equal(t, float32(7), h[0], "the inline term still applies; the unregistered one no more")
}
