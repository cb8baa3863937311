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
	for i, sp := range batch {
		raw, _, err := st.snap.View(KindComposed, sp.ID)
		require.NoError(t, err)
		v, _, act := st.cur[i].view.at(mlpIn)
		require.NotZero(t, act)
		require.True(t, inside(v, raw), "request %s's vector aliases its entry in the region", sp.ID)
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
