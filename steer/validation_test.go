package steer

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func filled(d int, x float32) []float32 {
	v := make([]float32, d)
	for i := range v {
		v[i] = x
	}
	return v
}

// Finite values whose products or composed sums exceed MaxMagnitude are refused with
// ErrOverflow at Register, SetGlobal and Admit, naming where, and nothing changes.
func TestMagnitudeBoundRefusedAtWrite(t *testing.T) {
	d := smallCfg.Hidden
	e := newOwner(t, smallCfg, Options{})
	_, err := e.Register("big", []Vector{{Hook: "post_attn", Layer: 1, Scale: 1, Data: filled(d, 1e29)}})
	require.NoError(t, err)
	vec := func(hook string, layer int, scale, x float32) Vector {
		return Vector{Hook: hook, Layer: layer, Scale: scale, Data: filled(d, x)}
	}
	dir := filled(d, 1)

	register := map[string]struct {
		vecs  []Vector
		words []string
	}{
		"3e38 x 3e38":      {[]Vector{vec("mlp_in", 2, 3e38, 3e38)}, []string{`named vector "x"`, "base tier", "mlp_in", "layer 2", "3e+38"}},
		"1e20 x 1e20":      {[]Vector{vec("mlp_out", 1, 1e20, 1e20)}, []string{"mlp_out", "layer 1", "vector 0 scale × data[0]", "1e+40"}},
		"scale over bound": {[]Vector{vec("pre_attn", 0, 2e30, 0)}, []string{"pre_attn", "layer 0", "coefficient", "2e+30"}},
		"data over bound":  {[]Vector{vec("pre_attn", 0, 1, 3e31)}, []string{"data[0]", "3e+31"}},
	}
	for name, tc := range register {
		t.Run("register "+name, func(t *testing.T) {
			v0 := e.Region().Version()
			_, err := e.Register("x", tc.vecs)
			require.ErrorIs(t, err, ErrOverflow)
			for _, w := range tc.words {
				require.Contains(t, err.Error(), w)
			}
			require.Equal(t, v0, e.Region().Version())
		})
	}
	// At the bound exactly: accepted.
	_, err = e.Register("edge", []Vector{vec("pre_attn", 0, 1e15, 1e15)})
	require.NoError(t, err)

	steering := map[string]struct {
		s     Steering
		words []string
	}{
		"3e38 x 3e38": {Steering{Decode: Tier{Vectors: []Vector{vec("mlp_out", 0, 3e38, 3e38)}}},
			[]string{"decode tier", "mlp_out", "layer 0", "3e+38"}},
		"base + decode sum": {Steering{Base: Tier{Vectors: []Vector{vec("post_attn", 1, 1, 8e29)}}, Decode: Tier{Vectors: []Vector{vec("post_attn", 1, 1, 8e29)}}},
			[]string{"decode tier", "post_attn", "layer 1", "composed component", "1.6e+30"}},
		"ref strength x scale x data": {Steering{Prefill: Tier{Refs: []Ref{{Name: "big", Strength: 100}}}},
			[]string{"prefill tier", "post_attn", "layer 1", `"big"`, "1e+31"}},
		"ref + inline sum": {Steering{Base: Tier{Refs: []Ref{{Name: "big", Strength: 9}}, Vectors: []Vector{vec("post_attn", 1, 1, 2e29)}}},
			[]string{"post_attn", "layer 1", "composed component", "1.1e+30"}},
		"clamp bound": {Steering{Base: Tier{Clamps: []Clamp{{Hook: "mlp_in", Layer: 2, Dir: dir, Min: -1, Max: 2e30, Strength: 1}}}},
			[]string{"mlp_in", "layer 2", "clamp 0 bound", "2e+30"}},
	}
	conv := ConvKey{Tenant: "t", ID: "c"}
	for name, tc := range steering {
		t.Run("admit "+name, func(t *testing.T) {
			v0, st0 := e.Region().Version(), e.Latches().StateHash()
			_, err := e.Admit(Admission{RequestID: "r1", Conversation: conv, Override: &tc.s})
			require.ErrorIs(t, err, ErrOverflow)
			require.Contains(t, err.Error(), `request "r1"`)
			for _, w := range tc.words {
				require.Contains(t, err.Error(), w)
			}
			require.Equal(t, v0, e.Region().Version())
			require.Equal(t, st0, e.Latches().StateHash())
		})
		t.Run("global "+name, func(t *testing.T) {
			v0 := e.Region().Version()
			_, err := e.SetGlobal(tc.s)
			require.ErrorIs(t, err, ErrOverflow)
			require.Contains(t, err.Error(), "global steering")
			for _, w := range tc.words {
				require.Contains(t, err.Error(), w)
			}
			require.Equal(t, v0, e.Region().Version())
		})
	}

	// A latched override and a ComposeAdd override each fit; together they do not: refused
	// before any latch operation.
	half := Steering{Base: Tier{Vectors: []Vector{vec("mlp_out", 2, 1, 6e29)}}}
	_, err = e.Admit(Admission{RequestID: "t1", Conversation: conv, Override: &half})
	require.NoError(t, err)
	add := half
	add.Compose = ComposeAdd
	v0, st0 := e.Region().Version(), e.Latches().StateHash()
	_, err = e.Admit(Admission{RequestID: "t2", Conversation: conv, Override: &add})
	require.ErrorIs(t, err, ErrOverflow)
	require.Contains(t, err.Error(), "latched steering + override")
	require.Contains(t, err.Error(), "1.2e+30")
	require.Equal(t, v0, e.Region().Version())
	require.Equal(t, st0, e.Latches().StateHash())
}

// A composition that would only exceed the bound later (a referenced named vector re-registered
// with larger values) is refused where it happens: the owner recomposes every set that
// references the vector in the same transaction, so Register fails with ErrOverflow naming the
// set, nothing changes, and steps keep applying the old, finite composition.
func TestStepperRefusesOverflowingComposition(t *testing.T) {
	d := smallCfg.Hidden
	for _, tier := range []string{"request", "global"} {
		t.Run(tier, func(t *testing.T) {
			e := newOwner(t, smallCfg, Options{})
			_, err := e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(d, 1)}})
			require.NoError(t, err)
			s := Steering{Decode: Tier{Refs: []Ref{{Name: "n", Strength: 1e20}}}}
			if tier == "global" {
				_, err = e.SetGlobal(s)
			} else {
				_, err = e.Admit(Admission{RequestID: "r", Override: &s})
			}
			require.NoError(t, err)
			st := e.NewStepper()
			defer st.Close()
			h := make([]float32, 2*d)
			batch := []Span{{ID: "r", Start: 0, End: 2, Phase: PhaseDecode}}
			require.NoError(t, st.Begin(0))
			require.NoError(t, st.Apply(3, 2, h, batch))
			require.Equal(t, float32(1e20), h[0])
			st.End()

			// Fine alone (1e15 ≤ MaxMagnitude), 1e35 once referenced with strength 1e20.
			v0 := e.Region().Version()
			_, err = e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(d, 1e15)}})
			require.ErrorIs(t, err, ErrOverflow)
			for _, w := range []string{"decode tier", "mlp_in", "layer 2", "1e+35", `named vector "n"`} {
				require.Contains(t, err.Error(), w)
			}
			if tier == "global" {
				require.Contains(t, err.Error(), "global steering")
			} else {
				require.Contains(t, err.Error(), `request "r"`)
			}
			require.Equal(t, v0, e.Region().Version(), "nothing changed")
			clear(h)
			require.NoError(t, st.Begin(0))
			require.NoError(t, st.Apply(3, 2, h, batch))
			require.Equal(t, float32(1e20), h[0], "the old composition still applies")
			st.End()
			clear(h)

			_, err = e.Register("n", []Vector{{Hook: "mlp_in", Layer: 2, Scale: 1, Data: filled(d, 2)}})
			require.NoError(t, err)
			require.NoError(t, st.Begin(0))
			require.NoError(t, st.Apply(3, 2, h, batch))
			require.Equal(t, float32(2e20), h[0])
			for _, f := range h {
				require.False(t, math.IsInf(float64(f), 0) || math.IsNaN(float64(f)))
			}
			st.End()
		})
	}
}

// An empty conversation id means "no conversation", whatever the tenant.
func TestEmptyConversationIDIsNoConversation(t *testing.T) {
	d := smallCfg.Hidden
	over := Steering{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Scale: 1, Data: filled(d, 1)}}}}
	cases := map[string]struct {
		conv        ConvKey
		wantLatched bool
	}{
		"tenant, no id":     {ConvKey{Tenant: "acme"}, false},
		"nothing":           {ConvKey{}, false},
		"tenant and id":     {ConvKey{Tenant: "acme", ID: "c1"}, true},
		"id without tenant": {ConvKey{ID: "c1"}, true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newOwner(t, smallCfg, Options{})
			a, err := e.Admit(Admission{RequestID: "r1", Conversation: tc.conv, Override: &over})
			require.NoError(t, err)
			require.Equal(t, tc.wantLatched, a.Latched)
			require.False(t, a.Refused)
			b, err := e.Admit(Admission{RequestID: "r2", Conversation: tc.conv})
			require.NoError(t, err)
			want := SourceNone
			if tc.wantLatched {
				want = SourceLatch
			}
			require.Equal(t, want, b.Source)
			n := 0
			if tc.wantLatched {
				n = 1
			}
			require.Equal(t, n, e.Latches().Stats().Conversations)
		})
	}
}

// A negative cap (LatchOff) turns latching off, visibly; zero still means the default.
func TestLatchOff(t *testing.T) {
	d := smallCfg.Hidden
	over := Steering{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Scale: 1, Data: filled(d, 1)}}}}
	conv := ConvKey{Tenant: "t", ID: "c"}
	cases := map[string]struct {
		cfg     LatchConfig
		latches bool
	}{
		"defaults":            {LatchConfig{}, true},
		"zero caps: defaults": {LatchConfig{MaxConversations: 0, MaxLatchedBytes: 0}, true},
		"conversations off":   {LatchConfig{MaxConversations: LatchOff}, false},
		"bytes off":           {LatchConfig{MaxLatchedBytes: LatchOff}, false},
		"any negative":        {LatchConfig{MaxConversations: -7}, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newOwner(t, smallCfg, Options{Latch: tc.cfg})
			st, err := e.Status()
			require.NoError(t, err)
			require.Equal(t, !tc.latches, st.LatchingOff)
			a, err := e.Admit(Admission{RequestID: "r1", Conversation: conv, Override: &over})
			require.NoError(t, err)
			require.Equal(t, tc.latches, a.Latched)
			require.False(t, a.Refused, "not refused for size")
			b, err := e.Admit(Admission{RequestID: "r2", Conversation: conv})
			require.NoError(t, err)
			require.Equal(t, tc.latches, b.Source == SourceLatch)
			ls := e.Latches().Stats()
			require.Equal(t, !tc.latches, ls.Off)
			require.EqualValues(t, 1, ls.Triggers, "offers are counted either way")
			// Every process sees it through the published status.
			st, err = newReader(t, e, Options{}).Status()
			require.NoError(t, err)
			require.Equal(t, !tc.latches, st.LatchingOff)
			require.EqualValues(t, 1, st.Triggers)
		})
	}
}

// A composition the write-time check admits (many terms summing to just under MaxMagnitude) is
// not refused by the Stepper because its float32 sum rounds differently.
func TestStepperAcceptsAdmittedNearBound(t *testing.T) {
	d := smallCfg.Hidden
	e := newOwner(t, smallCfg, Options{})
	_, err := e.Register("n", []Vector{{Hook: "post_block", Layer: 0, Scale: 1, Data: filled(d, 3e27)}})
	require.NoError(t, err)
	var refs []Ref
	// In float64 the sum is 9.999999e29; summed in float32 it rounds to 1.0000001e30.
	for range 16 {
		refs = append(refs, Ref{Name: "n", Strength: 20.833332})
	}
	s := Steering{Base: Tier{Refs: refs}}
	_, err = e.Admit(Admission{RequestID: "r", Override: &s})
	require.NoError(t, err)
	_, err = e.SetGlobal(s)
	require.NoError(t, err)
	st := e.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	h := make([]float32, d)
	require.NoError(t, st.Apply(2, 0, h, []Span{{ID: "r", Start: 0, End: 1, Phase: PhasePrefill}}))
	require.InEpsilon(t, 2e30, float64(h[0]), 1e-5)
	st.End()
}

// The owner re-checks the bound on bytes a worker sends: a hostile Register that skipped the
// worker's own check gets ErrOverflow back.
func TestOwnerRechecksMagnitudeFromWorker(t *testing.T) {
	d := smallCfg.Hidden
	owner := newOwner(t, smallCfg, Options{})
	lb := loopback{}
	owner.Serve(func(op uint16, h func([]byte) ([]byte, error)) { lb[op] = h })
	enc, _, err := EncodeSteering(&Steering{Base: Tier{Vectors: []Vector{{Hook: "mlp_in", Layer: 1, Scale: 3e38, Data: filled(d, 3e38)}}}}, smallCfg)
	require.NoError(t, err, "the wire format alone accepts finite values")
	w := newReader(t, owner, Options{Caller: lb})
	req := append([]byte{1, 0, 'z'}, enc...)
	v0 := owner.Region().Version()
	_, err = w.w.(remote).call(OpRegister, req)
	require.ErrorIs(t, err, ErrOverflow)
	require.Contains(t, err.Error(), "mlp_in")
	require.Equal(t, v0, owner.Region().Version())
}
