package mirror

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func testSealer(t testing.TB, seed byte) *sealer {
	s, err := newSealer(bytes.Repeat([]byte{seed}, 32), bytes.Repeat([]byte{seed + 1}, 32))
	require.NoError(t, err)
	return s
}

func testSigner(seed byte) *signer { return &signer{key: bytes.Repeat([]byte{seed}, 32)} }

func TestEnvelopeRoundTrip(t *testing.T) {
	e := envelope{flags: flagDeleted | flagExternal, kind: kindVector, origin: "host-1", incarnation: 42, seq: 7, payload: []byte("payload")}
	s := testSigner(1)
	b := s.sign("v.eA", &e)
	got, hdr, err := s.open("v.eA", b)
	require.NoError(t, err)
	require.Equal(t, e, got)
	require.Equal(t, e.header(), b[:hdr])

	ref := objectRef{name: "v.eA/abc", size: 99}
	ref.sum[3] = 1
	r2, err := decodeObjectRef(ref.encode())
	require.NoError(t, err)
	require.Equal(t, ref, r2)
}

// TestOpenRejects: a value without this deployment's tag is refused whatever else it holds.
func TestOpenRejects(t *testing.T) {
	s := testSigner(1)
	e := envelope{kind: kindVector, origin: "a", incarnation: 3, seq: 9, payload: []byte("steering")}
	good := s.sign("v.eA", &e)
	flipped := bytes.Clone(good)
	flipped[len(flipped)-tagSize-1] ^= 1
	reorigin := bytes.Clone(good)
	reorigin[7] = 'b'
	old := append([]byte("SMR1"), good[4:len(good)-tagSize]...)
	tests := []struct {
		name string
		ek   string
		b    []byte
		want error
	}{
		{"another key", "v.eA", testSigner(2).sign("v.eA", &e), ErrTampered},
		{"moved to another entry", "v.eQ", good, ErrTampered},
		{"payload bit flipped", "v.eA", flipped, ErrTampered},
		{"origin changed", "v.eA", reorigin, ErrTampered},
		{"tag cut", "v.eA", good[:len(good)-tagSize], ErrBadEnvelope},
		{"empty (a plain delete)", "v.eA", nil, ErrTampered},
		{"format 1", "v.eA", old, ErrOldFormat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := s.open(tt.ek, tt.b)
			require.ErrorIs(t, err, tt.want)
		})
	}
}

func TestDecodeEnvelopeRejects(t *testing.T) {
	good := testSigner(1).sign("k.AAAA", &envelope{kind: kindKey, origin: "h", seq: 1})
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"other magic", append([]byte("XXXX"), good[4:]...)},
		{"unknown flag", append(append([]byte{}, good[:4]...), append([]byte{0x80}, good[5:]...)...)},
		{"kind zero", append(append([]byte{}, good[:5]...), append([]byte{0}, good[6:]...)...)},
		{"kind too large", append(append([]byte{}, good[:5]...), append([]byte{9}, good[6:]...)...)},
		{"empty origin", append(append([]byte{}, good[:6]...), 0)},
		{"truncated", good[:len(good)-1]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := decodeEnvelope(tt.b)
			require.ErrorIs(t, err, ErrBadEnvelope)
		})
	}
}

func TestEntryNames(t *testing.T) {
	tests := []struct {
		ek   string
		kind byte
		name string
		ok   bool
	}{
		{vectorEntry("héllo/wörld .*>"), kindVector, "héllo/wörld .*>", true},
		{globalEntry, kindGlobal, "", true},
		{probeEntry("héllo/wörld .*>"), kindProbe, "héllo/wörld .*>", true},
		{"p.", 0, "", false},
		{testSealerKeyEntry, kindKey, "", true},
		{"v.", 0, "", false},
		{"v.!!", kindVector, "", false},
		{"x.abc", 0, "", false},
	}
	for _, tt := range tests {
		kind, name, ok := entryName(tt.ek)
		require.Equal(t, tt.ok, ok, tt.ek)
		if ok {
			require.Equal(t, tt.kind, kind)
			require.Equal(t, tt.name, name)
		}
	}
}

var testSealerKeyEntry = "k.AAAA"

func TestSealOpen(t *testing.T) {
	s := testSealer(t, 1)
	ek := s.keyEntry("req-1")
	env := envelope{flags: flagSealed, kind: kindKey, origin: "a", incarnation: 1, seq: 2}
	hdr := env.header()
	sealed := s.seal(ek, hdr, "req-1", stateLive, []byte("the-key"))
	require.Equal(t, magic[:], hdr[:4])
	require.NotContains(t, string(sealed), "the-key")
	require.NotContains(t, string(sealed), "req-1")

	id, state, key, err := s.open(ek, hdr, sealed)
	require.NoError(t, err)
	require.Equal(t, "req-1", id)
	require.Equal(t, stateLive, state)
	require.Equal(t, []byte("the-key"), key)

	otherHdr := (&envelope{flags: flagSealed, kind: kindKey, origin: "b", incarnation: 1, seq: 2}).header()
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)-20] ^= 1
	tests := []struct {
		name     string
		s        *sealer
		ek       string
		hdr, val []byte
	}{
		{"flipped ciphertext bit", s, ek, hdr, flipped},
		{"moved to another entry", s, s.keyEntry("req-2"), hdr, sealed},
		{"re-attributed to another host", s, ek, otherHdr, sealed},
		{"another secret", testSealer(t, 9), ek, hdr, sealed},
		{"truncated", s, ek, hdr, sealed[:10]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := tt.s.open(tt.ek, tt.hdr, tt.val)
			require.ErrorIs(t, err, ErrTampered)
		})
	}
}

func FuzzDecodeEnvelope(f *testing.F) {
	s := testSigner(1)
	f.Add(s.sign("v.eA", &envelope{kind: kindVector, origin: "a", seq: 1, payload: []byte("x")}))
	f.Add(s.sign("g", &envelope{flags: flagExternal, kind: kindGlobal, origin: "host", payload: objectRef{name: "g/1"}.encode()}))
	f.Add([]byte("SMR1"))
	f.Add([]byte("SMR2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, hdr, err := decodeEnvelope(b)
		if err != nil {
			if !errors.Is(err, ErrOldFormat) {
				require.ErrorIs(t, err, ErrBadEnvelope)
			}
			return
		}
		require.Equal(t, b[:hdr], e.header(), "the header re-encodes to the same bytes")
		require.Equal(t, b[hdr:len(b)-tagSize], e.payload)
		if e.flags&flagExternal != 0 {
			if r, err := decodeObjectRef(e.payload); err == nil {
				require.Equal(t, e.payload, r.encode())
			}
		}
	})
}

// FuzzOpenEnvelope: signer.open (decode and authenticate) accepts only what the key signed, and
// a value it accepts signs again to the same bytes.
func FuzzOpenEnvelope(f *testing.F) {
	s := testSigner(4)
	f.Add("v.eA", s.sign("v.eA", &envelope{kind: kindVector, origin: "a", seq: 1, payload: []byte("x")}))
	f.Add("k.AAAA", s.sign("k.AAAA", &envelope{flags: flagDeleted | flagPurge, kind: kindKey, origin: "b", seq: 2}))
	f.Add("g", []byte("SMR2\x00\x02\x01a"))
	f.Fuzz(func(t *testing.T, ek string, b []byte) {
		e, _, err := s.open(ek, b)
		if err != nil {
			if !errors.Is(err, ErrOldFormat) && !errors.Is(err, ErrTampered) {
				require.ErrorIs(t, err, ErrBadEnvelope)
			}
			return
		}
		require.Equal(t, b, s.sign(ek, &e), "only a value the key signed opens")
	})
}

func FuzzOpen(f *testing.F) {
	s := testSealer(f, 3)
	env := envelope{flags: flagSealed, kind: kindKey, origin: "a", seq: 1}
	f.Add(s.seal(s.keyEntry("r"), env.header(), "r", stateLive, []byte("k")))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _, err := s.open(s.keyEntry("r"), env.header(), b)
		if err != nil {
			require.ErrorIs(t, err, ErrTampered) // forging needs the key
		}
	})
}
