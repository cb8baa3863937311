package steer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Unregistering a named vector the global steering references drops the references and
// recomposes the global steering in the same transaction: the global keeps its other terms,
// a later merge (read the global, add, SetGlobal) still works, the observers hear of both
// changes at one version, and a global left empty is deleted. From a worker (through the
// owner's RPC handler) the same. Before, the global kept a reference to a name no longer
// registered, and every later SetGlobal of the merged set failed with ErrUnknownVector.
func TestUnregisterDropsGlobalReferences(t *testing.T) {
	d := smallCfg.Hidden
	for _, from := range []string{"owner", "worker"} {
		t.Run(from, func(t *testing.T) {
			e := newOwner(t, smallCfg, Options{})
			lb := loopback{}
			e.Serve(func(op uint16, h func([]byte) ([]byte, error)) { lb[op] = h })
			unregister := e.Unregister
			if from == "worker" {
				unregister = newReader(t, e, Options{Caller: lb}).Unregister
			}
			var changes []Change
			defer e.OnChange(func(c Change) { changes = append(changes, c) })()
			for _, n := range []string{"a", "b", "c"} {
				_, err := e.Register(n, []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: filled(d, 1)}})
				require.NoError(t, err)
			}
			g := Steering{
				Base:   Tier{Refs: []Ref{{Name: "a", Strength: 1}, {Name: "b", Strength: 2}}},
				Decode: Tier{Refs: []Ref{{Name: "a", Strength: 3}}},
			}
			_, err := e.SetGlobal(g)
			require.NoError(t, err)
			changes = nil

			v, err := unregister("a")
			require.NoError(t, err)
			require.Len(t, changes, 2)
			require.Equal(t, Change{Kind: ChangeVector, Name: "a", Deleted: true, Version: v}, changes[0])
			require.Equal(t, Change{Kind: ChangeGlobal, Version: v}, changes[1])
			snap, err := e.Region().Snapshot()
			require.NoError(t, err)
			cur, _, ok, err := e.Global(&snap)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, []Ref{{Name: "b", Strength: 2}}, cur.Base.Refs)
			require.Empty(t, cur.Decode.Refs)
			_, gv, _, err := e.Encoding(&snap, ChangeGlobal, "")
			require.NoError(t, err)
			require.Equal(t, v, gv, "rewritten in the unregister's transaction")
			snap.Close()

			// The composed global applies b only: 2 per component.
			st := e.NewStepper()
			require.NoError(t, st.Begin(0))
			h := make([]float32, d)
			require.NoError(t, st.Apply(2, 1, h, []Span{{ID: "no-request", Start: 0, End: 1, Phase: PhaseDecode}}))
			st.End()
			st.Close()
			require.Equal(t, float32(2), h[0])

			// A merge of the current global with a new reference works.
			cur.Base.Refs = append(cur.Base.Refs, Ref{Name: "c", Strength: 1})
			_, err = e.SetGlobal(cur)
			require.NoError(t, err)

			// Unregistering what is left of a references-only global deletes it.
			changes = nil
			_, err = unregister("b")
			require.NoError(t, err)
			v, err = unregister("c")
			require.NoError(t, err)
			require.Equal(t, Change{Kind: ChangeGlobal, Deleted: true, Version: v}, changes[len(changes)-1])
			snap, err = e.Region().Snapshot()
			require.NoError(t, err)
			defer snap.Close()
			_, _, ok, err = e.Global(&snap)
			require.NoError(t, err)
			require.False(t, ok)
			_, err = e.SetGlobal(Steering{Base: Tier{Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: filled(d, 1)}}}})
			require.NoError(t, err)
		})
	}
}
