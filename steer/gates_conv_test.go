package steer

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var convGates = []Gate{{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 100}, Scope: ScopeRestOfConversation,
	Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}}}

// waitEngaged polls the owner's table until conversation k's gates are all engaged.
func waitEngaged(t *testing.T, e *Owner, k ConvKey) []byte {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, found, err := e.GateConversation(k)
		require.NoError(t, err)
		require.True(t, found)
		_, c, err := decodeGateConv(b, e.Config())
		require.NoError(t, err)
		all := true
		for _, en := range c.engaged {
			all = all && en
		}
		if all {
			return b
		}
		require.True(t, time.Now().Before(deadline), "the owner never heard that the gate engaged")
		time.Sleep(time.Millisecond)
	}
}

// The owner learns that a conversation's rest_of_conversation gate engaged (a Stepper reports
// it), stores the carried gate engaged in the next request's entry, so a Stepper that never
// saw it engage applies it from the first step; the table survives an export and a restore
// into another owner; a bad entry is refused and changes nothing.
func TestGatesRestOfConversationEngagedAtOwner(t *testing.T) {
	e := gateTableEngine(t)
	conv := ConvKey{Tenant: "t", ID: "c"}
	admit := func(e *Owner, id string, c ConvKey, g []Gate) {
		t.Helper()
		_, err := e.Admit(Admission{RequestID: id, Conversation: c, Override: gateTableSteering(), Gates: g})
		require.NoError(t, err)
	}
	at := func(st *Stepper, id string, h0 float32) added {
		return runGateStep(t, st, id, gateStep{h0: []float32{h0}})[2][0]
	}
	st := e.NewStepper()
	defer st.Close()
	admit(e, "r1", conv, convGates)
	require.Equal(t, added{0, 1}, at(st, "r1", 0.9), "fired: from the next step")
	require.Equal(t, added{2, 1}, at(st, "r1", 0.1))
	waitEngaged(t, e, conv)

	admit(e, "r2", conv, nil)
	g := gatesAt(t, e, "r2")
	require.Len(t, g, 1)
	require.True(t, g[0].Engaged, "carried engaged")
	fresh := e.NewStepper() // a restarted worker, another host's: it never saw the gate fire
	defer fresh.Close()
	require.Equal(t, added{2, 1}, at(fresh, "r2", 0.1), "engaged from the first step on a fresh Stepper")

	// Brought again by a later request, the same gate keeps its engaged state.
	admit(e, "r3", conv, convGates)
	require.True(t, gatesAt(t, e, "r3")[0].Engaged)
	require.Equal(t, added{2, 1}, at(e.NewStepper(), "r3", 0.1))

	// Exported and restored into another owner (serve's state dir, the mirror).
	all, err := e.GateConversations()
	require.NoError(t, err)
	require.Len(t, all, 1)
	e2 := gateTableEngine(t)
	for _, b := range all {
		require.NoError(t, e2.RestoreGateConversation(b))
	}
	again, err := e2.GateConversations()
	require.NoError(t, err)
	require.Equal(t, all, again, "restored as exported")
	admit(e2, "r4", conv, nil)
	require.True(t, gatesAt(t, e2, "r4")[0].Engaged)
	require.Equal(t, added{2, 1}, at(e2.NewStepper(), "r4", 0.1))

	// An inline source round-trips too, its digest recomputed from its vectors.
	inline := []Gate{convGates[0]}
	v := make([]float32, smallCfg.Hidden)
	v[1] = 1
	inline[0].Apply.Steer = GateSource{Vectors: []Vector{{Hook: "post_block", Layer: 2, Scale: 1, Data: v}}}
	admit(e, "i1", ConvKey{ID: "inline"}, inline)
	b, found, err := e.GateConversation(ConvKey{ID: "inline"})
	require.NoError(t, err)
	require.True(t, found)
	require.NoError(t, e2.RestoreGateConversation(b))
	b2, _, err := e2.GateConversation(ConvKey{ID: "inline"})
	require.NoError(t, err)
	require.Equal(t, b, b2)

	// Refused: every cut of a valid entry, a flipped digest is still an entry (named sources
	// are checked at the next admission), a wrong scope is not.
	before, err := e2.GateConversations()
	require.NoError(t, err)
	for i := range all[0] {
		require.ErrorIs(t, e2.RestoreGateConversation(all[0][:i]), ErrBadEncoding, "cut at %d", i)
	}
	bad := append([]byte(nil), all[0]...)
	bad[gconvHdr+len("t")+len("c")+1] = byte(ScopeRestOfRequest)
	require.ErrorIs(t, e2.RestoreGateConversation(bad), ErrBadEncoding)
	after, err := e2.GateConversations()
	require.NoError(t, err)
	require.Equal(t, before, after, "nothing changed")

	// Workers report through the owner; a worker without a Caller has no one to tell.
	require.NoError(t, newReader(t, e, Options{}).w.gateEngaged([]uint64{1}))
}

// A worker's report reaches the owner over its Caller (OpGateEngaged).
func TestGateEngagedFromWorker(t *testing.T) {
	owner := gateTableEngine(t)
	lb := loopback{}
	owner.Serve(func(op uint16, h func([]byte) ([]byte, error)) { lb[op] = h })
	w := newReader(t, owner, Options{Caller: lb})
	conv := ConvKey{ID: "c"}
	_, err := owner.Admit(Admission{RequestID: "r1", Conversation: conv, Override: gateTableSteering(), Gates: convGates})
	require.NoError(t, err)
	st := w.NewStepper()
	defer st.Close()
	runGateStep(t, st, "r1", gateStep{h0: []float32{0.9}})
	waitEngaged(t, owner, conv)
	_, err = lb[OpGateEngaged]([]byte{1, 2, 3})
	require.ErrorIs(t, err, ErrBadEncoding)
}

// The table has the latch map's caps: a tenant at MaxPerTenant evicts its own oldest, the
// count cap evicts the oldest of all; evictions are Changes (deleted).
func TestGateConversationsCaps(t *testing.T) {
	e := newOwner(t, smallCfg, Options{Latch: LatchConfig{MaxConversations: 4, MaxPerTenant: 2}})
	unit := make([]float32, smallCfg.Hidden)
	unit[0] = 1
	_, err := e.RegisterProbe("p", []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: unit}})
	require.NoError(t, err)
	_, err = e.Register("s", []Vector{{Hook: "post_block", Layer: 2, Scale: 1, Data: unit}})
	require.NoError(t, err)
	var deleted []string
	e.OnChange(func(c Change) {
		if c.Kind == ChangeConversation && c.Deleted {
			k, _ := ParseGateConversationName(c.Name)
			deleted = append(deleted, k.Tenant+"/"+k.ID)
		}
	})
	keys := func() []string {
		var out []string
		for _, k := range e.gateConv.order {
			out = append(out, k.Tenant+"/"+k.ID)
		}
		return out
	}
	for i, k := range []ConvKey{{"a", "1"}, {"b", "1"}, {"a", "2"}, {"a", "3"}, {"", "x"}, {"", "y"}} {
		_, err := e.Admit(Admission{RequestID: strings.Repeat("r", i+1), Conversation: k, Gates: convGates})
		require.NoError(t, err)
	}
	require.Equal(t, []string{"a/1", "b/1"}, deleted, "a's own oldest at its cap, then the oldest of all at the count cap")
	require.Equal(t, []string{"a/2", "a/3", "/x", "/y"}, keys())
	require.Equal(t, map[string]int{"a": 2}, e.gateConv.use)
}

// FuzzDecodeGateConversation: the SGCV decoder (and GateConversationKey, its header alone) never
// panics, never aliases its input, and what it accepts encodes back to the same bytes.
func FuzzDecodeGateConversation(f *testing.F) {
	e := gateTableEngine(f)
	v := make([]float32, smallCfg.Hidden)
	v[1] = 1
	inline := []Gate{convGates[0]}
	inline[0].Apply.Steer = GateSource{Vectors: []Vector{{Hook: "post_block", Layer: 2, Scale: 1, Data: v}}}
	for i, g := range [][]Gate{convGates, inline} {
		k := ConvKey{Tenant: "t", ID: strings.Repeat("c", i+1)}
		_, err := e.Admit(Admission{RequestID: k.ID, Conversation: k, Gates: g})
		require.NoError(f, err)
		b, _, err := e.GateConversation(k)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := append([]byte(nil), b...)
		hk, herr := GateConversationKey(b) // the header alone (the mirror checks an entry's name)
		k, c, err := decodeGateConv(in, smallCfg)
		if err != nil {
			return
		}
		if herr != nil || hk != k {
			t.Fatalf("decoded %+v, the header reads %+v (%v)", k, hk, herr)
		}
		for i := range in {
			in[i] ^= 0xff // nothing decoded may alias the input
		}
		out, err := e.encodeGateConv(k, c)
		if err != nil || string(out) != string(b) {
			t.Fatalf("accepted %x, encodes back as %x (%v)", b, out, err)
		}
	})
}
