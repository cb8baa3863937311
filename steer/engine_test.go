package steer

import (
	"crypto/sha256"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

func TestConfigRoundTrip(t *testing.T) {
	for _, c := range []ModelConfig{smallCfg, {Hidden: 4096, Layers: 80, Hooks: []string{"a", "b"}}, {Hidden: 1, Layers: 1, Hooks: DefaultHooks}} {
		b, err := c.MarshalBinary()
		require.NoError(t, err)
		require.LessOrEqual(t, len(b), shm.UserConfigSize)
		padded := make([]byte, shm.UserConfigSize)
		copy(padded, b)
		var got ModelConfig
		require.NoError(t, got.UnmarshalBinary(padded))
		require.True(t, got.Equal(c), "%+v vs %+v", got, c)
	}
}

func TestConfigValidate(t *testing.T) {
	long := strings.Repeat("h", maxHookName+1)
	for name, c := range map[string]ModelConfig{
		"hidden 0":       {Hidden: 0, Layers: 1},
		"hidden huge":    {Hidden: MaxHidden + 1, Layers: 1},
		"layers 0":       {Hidden: 8, Layers: 0},
		"no hooks":       {Hidden: 8, Layers: 1, Hooks: []string{}},
		"dup hook":       {Hidden: 8, Layers: 1, Hooks: []string{"a", "a"}},
		"empty hook":     {Hidden: 8, Layers: 1, Hooks: []string{""}},
		"long hook name": {Hidden: 8, Layers: 1, Hooks: []string{long}},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, c.Validate(), ErrBadConfig)
			_, err := RegionConfig(c, shm.Config{})
			require.ErrorIs(t, err, ErrBadConfig)
		})
	}
}

func TestOpenIncompatible(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	other := ModelConfig{Hidden: 41, Layers: 3}
	_, err := Open(e.Region(), &other, Options{})
	require.ErrorIs(t, err, ErrIncompatible)
	// A model mismatch is not a region layout problem, and the message says what differs.
	require.NotErrorIs(t, err, shm.ErrIncompatible)
	require.NotContains(t, err.Error(), "layout")
	for _, w := range []string{"model config mismatch", "hidden 40", "hidden 41", "same model config"} {
		require.Contains(t, err.Error(), w)
	}
	hooks := ModelConfig{Hidden: 40, Layers: 3, Hooks: []string{"pre_attn"}}
	_, err = Open(e.Region(), &hooks, Options{})
	require.ErrorIs(t, err, ErrIncompatible)

	// A region created without a steering config (or by another steer version).
	r, err := shm.Create(shm.Config{IndexSlots: 64, ArenaBytes: 1 << 16, UserConfig: []byte("something else")})
	require.NoError(t, err)
	defer r.Close()
	_, err = Open(r, nil, Options{})
	require.ErrorIs(t, err, ErrIncompatible)
	require.ErrorIs(t, err, shm.ErrIncompatible)

	// Same config from a reader: fine.
	rd := newReader(t, e, Options{})
	require.True(t, rd.Config().Equal(smallCfg))
}

// Each side opens its own kind of region: the owner the one it created, a worker one it
// attached to; the other way round is ErrNotOwner, whose message names the right call.
func TestOpenWrongSide(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	_, err := Attach(e.Region(), nil, Options{})
	require.ErrorIs(t, err, ErrNotOwner)
	require.Contains(t, err.Error(), "steer.Open")
	r, err := shm.Open(e.Region().Files())
	require.NoError(t, err)
	defer r.Close()
	_, err = Open(r, nil, Options{})
	require.ErrorIs(t, err, ErrNotOwner)
	require.Contains(t, err.Error(), "steer.Attach")
	w, err := Attach(r, &smallCfg, Options{})
	require.NoError(t, err)
	require.True(t, w.Config().Equal(e.Config()))
}

func TestRegisterReadUnregister(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	e := newOwner(t, smallCfg, Options{})
	vecs := []Vector{{Hook: "pre_attn", Layer: 0, Scale: 2, Data: randVec(rng, 40)}, {Hook: "mlp_out", Layer: 2, Scale: -1, Data: randVec(rng, 40)}}
	info, err := e.Register("happy", vecs)
	require.NoError(t, err)
	require.NotZero(t, info.Version)

	s, err := e.Region().Snapshot()
	require.NoError(t, err)
	nv, err := e.Vector(&s, "happy")
	require.NoError(t, err)
	require.Equal(t, info.Version, nv.Version)
	require.Equal(t, info.Digest, nv.Digest)
	require.Len(t, nv.Vectors, 2)
	for i := range vecs {
		require.Equal(t, vecs[i], nv.Vectors[i])
	}
	// The digest is the sha256 of the stored bytes with the digest field zeroed.
	raw, _, err := s.View(KindVector, "happy")
	require.NoError(t, err)
	c := append([]byte(nil), raw...)
	clear(c[32:64])
	require.Equal(t, Digest(sha256.Sum256(c)), nv.Digest)
	// Zero-copy: the floats alias the mapping.
	require.Equal(t, &shm.AsFloat32(raw[len(raw)-2*192:])[0], &nv.Vectors[0].Data[0])

	// Last writer wins; the old snapshot still sees the old version.
	vecs2 := []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, 40)}}
	info2, err := e.Register("happy", vecs2)
	require.NoError(t, err)
	require.Greater(t, info2.Version, info.Version)
	require.NotEqual(t, info.Digest, info2.Digest)
	old, err := e.Vector(&s, "happy")
	require.NoError(t, err)
	require.Equal(t, info.Digest, old.Digest)
	s.Close()
	s, err = e.Region().Snapshot()
	require.NoError(t, err)
	nv, err = e.Vector(&s, "happy")
	require.NoError(t, err)
	require.Equal(t, info2.Digest, nv.Digest)
	infos, err := e.VectorInfos(&s)
	require.NoError(t, err)
	require.Equal(t, []VectorInfo{info2}, infos)
	s.Close()

	_, err = e.Unregister("happy")
	require.NoError(t, err)
	_, err = e.Unregister("happy")
	require.ErrorIs(t, err, ErrUnknownVector)
	s, err = e.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	_, err = e.Vector(&s, "happy")
	require.ErrorIs(t, err, ErrUnknownVector)
}

func badInputs(rng *rand.Rand) map[string]struct {
	vecs []Vector
	err  error
} {
	good := func() []float32 { return randVec(rng, 40) }
	nan := good()
	nan[7] = float32(math.NaN())
	inf := good()
	inf[39] = float32(math.Inf(-1))
	return map[string]struct {
		vecs []Vector
		err  error
	}{
		"NaN data":       {[]Vector{{Hook: "pre_attn", Scale: 1, Data: nan}}, ErrNonFinite},
		"Inf data":       {[]Vector{{Hook: "pre_attn", Scale: 1, Data: inf}}, ErrNonFinite},
		"Inf scale":      {[]Vector{{Hook: "pre_attn", Scale: float32(math.Inf(1)), Data: good()}}, ErrNonFinite},
		"short":          {[]Vector{{Hook: "pre_attn", Scale: 1, Data: good()[:39]}}, ErrHiddenSize},
		"long":           {[]Vector{{Hook: "pre_attn", Scale: 1, Data: append(good(), 1)}}, ErrHiddenSize},
		"unknown hook":   {[]Vector{{Hook: "attn", Scale: 1, Data: good()}}, ErrUnknownHook},
		"layer -1":       {[]Vector{{Hook: "pre_attn", Layer: -1, Scale: 1, Data: good()}}, ErrLayerRange},
		"layer too big":  {[]Vector{{Hook: "pre_attn", Layer: 3, Scale: 1, Data: good()}}, ErrLayerRange},
		"duplicate site": {[]Vector{{Hook: "mlp_in", Layer: 1, Scale: 1, Data: good()}, {Hook: "mlp_in", Layer: 1, Scale: 2, Data: good()}}, ErrDuplicate},
		"empty set":      {nil, ErrEmptySet},
	}
}

func TestRegisterRejectsBadInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	e := newOwner(t, smallCfg, Options{})
	_, err := e.Register("keep", []Vector{{Hook: "pre_attn", Scale: 1, Data: randVec(rng, 40)}})
	require.NoError(t, err)
	for name, tc := range badInputs(rng) {
		t.Run(name, func(t *testing.T) {
			v0 := e.Region().Version()
			_, err := e.Register("keep", tc.vecs)
			require.ErrorIs(t, err, tc.err)
			require.Equal(t, v0, e.Region().Version(), "nothing may change on failure")
		})
	}
	for _, name := range []string{"", strings.Repeat("n", MaxNameLen+1)} {
		_, err := e.Register(name, []Vector{{Hook: "pre_attn", Scale: 1, Data: randVec(rng, 40)}})
		require.ErrorIs(t, err, ErrBadName)
		_, err = e.Unregister(name)
		require.ErrorIs(t, err, ErrBadName)
	}
	_, err = e.Register(strings.Repeat("n", MaxNameLen), []Vector{{Hook: "pre_attn", Scale: 1, Data: randVec(rng, 40)}})
	require.NoError(t, err)
}

// loopback connects a worker engine to the owner's handlers in-process, as ipc would.
type loopback map[uint16]func([]byte) ([]byte, error)

func (l loopback) Call(op uint16, req []byte) ([]byte, error) {
	h, ok := l[op]
	if !ok {
		return nil, errors.New("no handler")
	}
	return h(append([]byte(nil), req...))
}

func TestWorkerWritesThroughOwner(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	owner := newOwner(t, smallCfg, Options{})
	lb := loopback{}
	owner.Serve(func(op uint16, h func([]byte) ([]byte, error)) { lb[op] = h })

	lone := newReader(t, owner, Options{})
	_, err := lone.Register("x", []Vector{{Hook: "pre_attn", Scale: 1, Data: randVec(rng, 40)}})
	require.ErrorIs(t, err, ErrNotOwner)

	w := newReader(t, owner, Options{Caller: lb})
	vecs := []Vector{{Hook: "post_attn", Layer: 2, Scale: 0.5, Data: randVec(rng, 40)}}
	info, err := w.Register("from-worker", vecs)
	require.NoError(t, err)
	s, err := w.Region().Snapshot()
	require.NoError(t, err)
	nv, err := w.Vector(&s, "from-worker")
	s.Close()
	require.NoError(t, err)
	require.Equal(t, info.Digest, nv.Digest)
	require.Equal(t, info.Version, nv.Version)

	// Validation happens in the worker first; a hostile request is re-validated by the owner,
	// and its typed error comes back.
	for name, tc := range badInputs(rng) {
		_, err := w.Register("from-worker", tc.vecs)
		require.ErrorIs(t, err, tc.err, name)
	}
	bad, _, err := EncodeSteering(&Steering{Base: Tier{Vectors: vecs}}, smallCfg)
	require.NoError(t, err)
	bad[64+8] = 0xff // scale → NaN-ish bits, digest now wrong
	req := append([]byte{1, 0, 'z'}, bad...)
	_, err = lb[OpRegister](req)
	require.ErrorIs(t, err, ErrBadEncoding)
	require.Equal(t, proto.CodeBadEncoding, proto.CodeOf(err), "the code the worker decodes back to ErrBadEncoding")

	_, err = w.Unregister("from-worker")
	require.NoError(t, err)
	_, err = w.Unregister("from-worker")
	require.ErrorIs(t, err, ErrUnknownVector)
}

func TestAdmitRejectsBadInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	e := newOwner(t, smallCfg, Options{})
	_, err := e.Register("known", []Vector{{Hook: "pre_attn", Scale: 1, Data: randVec(rng, 40)}})
	require.NoError(t, err)
	zero := make([]float32, 40)
	nanDir := unitVec(rng, 40)
	nanDir[0] = float32(math.NaN())
	cases := map[string]struct {
		s   Steering
		err error
	}{
		"unknown ref":     {Steering{Base: Tier{Refs: []Ref{{Name: "nope", Strength: 1}}}}, ErrUnknownVector},
		"ref bad name":    {Steering{Decode: Tier{Refs: []Ref{{Name: "", Strength: 1}}}}, ErrBadName},
		"ref NaN":         {Steering{Prefill: Tier{Refs: []Ref{{Name: "known", Strength: float32(math.NaN())}}}}, ErrNonFinite},
		"clamp min>max":   {Steering{Base: Tier{Clamps: []Clamp{{Hook: "pre_attn", Dir: unitVec(rng, 40), Min: 1, Max: 0, Strength: 1}}}}, ErrBadClamp},
		"clamp zero dir":  {Steering{Base: Tier{Clamps: []Clamp{{Hook: "pre_attn", Dir: zero, Strength: 1}}}}, ErrBadClamp},
		"clamp NaN dir":   {Steering{Base: Tier{Clamps: []Clamp{{Hook: "pre_attn", Dir: nanDir, Strength: 1}}}}, ErrNonFinite},
		"clamp Inf max":   {Steering{Base: Tier{Clamps: []Clamp{{Hook: "pre_attn", Dir: unitVec(rng, 40), Max: float32(math.Inf(1)), Strength: 1}}}}, ErrNonFinite},
		"clamp dir short": {Steering{Base: Tier{Clamps: []Clamp{{Hook: "pre_attn", Dir: zero[:3], Strength: 1}}}}, ErrHiddenSize},
		"clamp hook":      {Steering{Base: Tier{Clamps: []Clamp{{Hook: "x", Dir: unitVec(rng, 40), Strength: 1}}}}, ErrUnknownHook},
		"clamp layer":     {Steering{Base: Tier{Clamps: []Clamp{{Hook: "pre_attn", Layer: 9, Dir: unitVec(rng, 40), Strength: 1}}}}, ErrLayerRange},
		"vector NaN":      {Steering{Decode: Tier{Vectors: []Vector{{Hook: "mlp_in", Scale: 1, Data: nanDir}}}}, ErrNonFinite},
		"vector dup":      {Steering{Decode: Tier{Vectors: []Vector{{Hook: "mlp_in", Scale: 1, Data: zero}, {Hook: "mlp_in", Scale: 1, Data: zero}}}}, ErrDuplicate},
		"bad compose":     {Steering{Compose: 9, Base: Tier{Refs: []Ref{{Name: "known", Strength: 1}}}}, ErrBadEncoding},
	}
	conv := ConvKey{Tenant: "t", ID: "c"}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v0, st0 := e.Region().Version(), e.Latches().StateHash()
			_, err := e.Admit(Admission{RequestID: "r1", Conversation: conv, Override: &tc.s})
			require.ErrorIs(t, err, tc.err)
			require.Equal(t, v0, e.Region().Version())
			require.Equal(t, st0, e.Latches().StateHash())
			if tc.err == ErrBadEncoding {
				return // SetGlobal ignores Compose
			}
			_, err = e.SetGlobal(tc.s)
			require.ErrorIs(t, err, tc.err)
			require.Equal(t, v0, e.Region().Version())
		})
	}
	for _, id := range []string{"", strings.Repeat("i", MaxIDLen+1)} {
		_, err := e.Admit(Admission{RequestID: id})
		require.ErrorIs(t, err, ErrBadRequestID)
		_, err = e.End(id)
		require.ErrorIs(t, err, ErrBadRequestID)
	}
}

func TestAdmitLatchBridgeCompose(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	e := newOwner(t, smallCfg, Options{})
	_, err := e.Register("calm", []Vector{{Hook: "pre_attn", Layer: 1, Scale: 1, Data: randVec(rng, 40)}})
	require.NoError(t, err)
	conv := ConvKey{Tenant: "acme", ID: "chat-1"}
	over := Steering{Base: Tier{Vectors: []Vector{{Hook: "mlp_out", Layer: 0, Scale: 1, Data: randVec(rng, 40)}}}}

	a, err := e.Admit(Admission{RequestID: "t1", Conversation: conv, Override: &over})
	require.NoError(t, err)
	require.Equal(t, SourceOverride, a.Source)
	require.True(t, a.Latched)

	// Next turn without an override bridges the latch.
	a2, err := e.Admit(Admission{RequestID: "t2", Conversation: conv})
	require.NoError(t, err)
	require.Equal(t, SourceLatch, a2.Source)
	require.Equal(t, a.Digest, a2.Digest, "the bridged steering is the latched override")

	// Another tenant with the same conversation id sees nothing.
	a3, err := e.Admit(Admission{RequestID: "t3", Conversation: ConvKey{Tenant: "other", ID: "chat-1"}})
	require.NoError(t, err)
	require.Equal(t, SourceNone, a3.Source)

	// ComposeAdd stacks a by-reference override on the latch, and latches the composition.
	add := Steering{Compose: ComposeAdd, Decode: Tier{Refs: []Ref{{Name: "calm", Strength: 2}}}}
	a4, err := e.Admit(Admission{RequestID: "t4", Conversation: conv, Override: &add})
	require.NoError(t, err)
	require.Equal(t, SourceComposed, a4.Source)
	s, err := e.Region().Snapshot()
	require.NoError(t, err)
	b, _, err := s.View(KindRequest, "t4")
	require.NoError(t, err)
	got, dg, err := DecodeSteering(b, smallCfg)
	require.NoError(t, err)
	require.Equal(t, a4.Digest, dg)
	require.Len(t, got.Base.Vectors, 1)
	require.Equal(t, []Ref{{Name: "calm", Strength: 2}}, got.Decode.Refs)
	s.Close()

	// ComposeReplace drops the latched part.
	rep := Steering{Decode: Tier{Refs: []Ref{{Name: "calm", Strength: 1}}}}
	a5, err := e.Admit(Admission{RequestID: "t5", Conversation: conv, Override: &rep})
	require.NoError(t, err)
	require.Equal(t, SourceOverride, a5.Source)
	st := e.Latches().Stats()
	require.Equal(t, int64(0), st.Bytes, "a by-reference latch costs no bytes")
	require.Equal(t, 1, st.Conversations)

	// Re-registering the referenced vector changes its digest: the next bridge drops the latch.
	_, err = e.Register("calm", []Vector{{Hook: "pre_attn", Layer: 1, Scale: 1, Data: randVec(rng, 40)}})
	require.NoError(t, err)
	a6, err := e.Admit(Admission{RequestID: "t6", Conversation: conv})
	require.NoError(t, err)
	require.Equal(t, SourceNone, a6.Source)
	require.Equal(t, uint64(1), e.Latches().Stats().BridgeDrops)

	// End removes a request's entry; Status agrees from a reader.
	for _, id := range []string{"t1", "t2", "t3", "t4", "t5", "t6", "never"} {
		_, err := e.End(id)
		require.NoError(t, err)
	}
	rd := newReader(t, e, Options{})
	status, err := rd.Status()
	require.NoError(t, err)
	require.Equal(t, 0, status.RequestsWithSteering)
	require.Equal(t, 1, status.NamedVectors)
	require.Equal(t, uint64(1), status.BridgeDrops)
	require.Equal(t, uint64(3), status.Triggers)
	require.Equal(t, uint64(2), status.Bridges) // t2, and t4's compose
	require.Equal(t, 0, status.LatchedConversations)
	require.Equal(t, -1, status.AttachedClients)
	require.NotZero(t, status.ArenaUsed)
	require.NotZero(t, status.ArenaFree)
}

func TestOversizeOverrideStillSteersItsTurn(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	e := newOwner(t, smallCfg, Options{Latch: LatchConfig{MaxLatchedBytes: 200}})
	conv := ConvKey{ID: "c"}
	small := Steering{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Scale: 1, Data: randVec(rng, 40)}}}} // 160 bytes
	a, err := e.Admit(Admission{RequestID: "r1", Conversation: conv, Override: &small})
	require.NoError(t, err)
	require.True(t, a.Latched)
	big := Steering{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Scale: 1, Data: randVec(rng, 40)}, {Hook: "mlp_in", Scale: 1, Data: randVec(rng, 40)}}}}
	a, err = e.Admit(Admission{RequestID: "r2", Conversation: conv, Override: &big})
	require.NoError(t, err)
	require.True(t, a.Refused)
	require.Equal(t, SourceOverride, a.Source)
	s, err := e.Region().Snapshot()
	require.NoError(t, err)
	_, _, err = s.View(KindRequest, "r2")
	s.Close()
	require.NoError(t, err, "the refused override still steers its own request")
	a, err = e.Admit(Admission{RequestID: "r3", Conversation: conv})
	require.NoError(t, err)
	require.Equal(t, SourceNone, a.Source, "the older latch was dropped too")
	st, err := e.Status()
	require.NoError(t, err)
	require.Equal(t, uint64(1), st.OversizeRefusals)
	require.Equal(t, 0, st.LatchedConversations)
}
