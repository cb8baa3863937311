package steer

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A model hint is stored with its steering vector, locally and from a worker, listed, replaced
// with the vector and removed with it; a bad hint is a typed error that changes nothing.
func TestModelHintStoredWithVector(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	owner := newOwner(t, smallCfg, Options{})
	lb := loopback{}
	owner.Serve(func(op uint16, h func([]byte) ([]byte, error)) { lb[op] = h })
	worker := newReader(t, owner, Options{Caller: lb})
	vecs := []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: randVec(rng, 40)}}

	hintOf := func(name string) (string, string) {
		s, err := owner.Region().Snapshot()
		require.NoError(t, err)
		defer s.Close()
		m, err := worker.VectorMeta(&s, name)
		require.NoError(t, err)
		infos, err := worker.VectorInfos(&s)
		require.NoError(t, err)
		listed := "<unlisted>"
		for _, in := range infos {
			if in.Name == name {
				listed = in.ModelHint
			}
		}
		return m.ModelHint, listed
	}
	for _, e := range []*Engine{owner.Engine, worker.Engine} {
		info, err := e.Register("v", vecs, ModelHint("llama"))
		require.NoError(t, err)
		require.Equal(t, "llama", info.ModelHint)
		got, listed := hintOf("v")
		require.Equal(t, "llama", got)
		require.Equal(t, "llama", listed)

		// Refused hints: typed, and the stored vector and hint stay.
		for _, bad := range []string{strings.Repeat("a", MaxModelHint+1), "ll\nama", "\xff\xfe", "tab\there"} {
			_, err := e.Register("v", vecs[:0:0], ModelHint(bad))
			require.ErrorIs(t, err, ErrBadModelHint, "%q", bad)
			_, err = e.Register("v", vecs, ModelHint(bad))
			require.ErrorIs(t, err, ErrBadModelHint, "%q", bad)
			got, _ := hintOf("v")
			require.Equal(t, "llama", got)
		}
		_, err = e.Register("v", vecs, ModelHint(strings.Repeat("é", MaxModelHint/2)))
		require.NoError(t, err)
		got, _ = hintOf("v")
		require.Equal(t, strings.Repeat("é", MaxModelHint/2), got)

		// Registered again without a hint: the new version has none.
		_, err = e.Register("v", vecs)
		require.NoError(t, err)
		got, listed = hintOf("v")
		require.Equal(t, "", got)
		require.Equal(t, "", listed)

		_, err = e.Register("v", vecs, ModelHint("qwen2"))
		require.NoError(t, err)
		_, err = e.Unregister("v")
		require.NoError(t, err)
		got, listed = hintOf("v")
		require.Equal(t, "", got)
		require.Equal(t, "<unlisted>", listed)
		s, err := owner.Region().Snapshot()
		require.NoError(t, err)
		_, _, err = s.View(KindVectorMeta, "v")
		s.Close()
		require.Error(t, err, "the metadata entry is removed with its vector")

		_, err = e.RegisterProbe("p", vecs, ModelHint("llama"))
		require.ErrorIs(t, err, ErrBadModelHint)
	}
}

func TestVectorMetaEncoding(t *testing.T) {
	require.Nil(t, EncodeVectorMeta(VectorMeta{}))
	b := EncodeVectorMeta(VectorMeta{ModelHint: "llama"})
	m, n, err := DecodeVectorMeta(append(b, "SSTR..."...))
	require.NoError(t, err)
	require.Equal(t, len(b), n)
	require.Equal(t, "llama", m.ModelHint)
	for i := range b {
		_, _, err := DecodeVectorMeta(b[:i])
		require.ErrorIs(t, err, ErrBadEncoding, "cut at %d", i)
	}
	bad := append([]byte(nil), b...)
	bad[len(bad)-1] = '\n'
	_, _, err = DecodeVectorMeta(bad)
	require.ErrorIs(t, err, ErrBadModelHint)
}

// FuzzDecodeVectorMeta: the decoder never panics, never reads past b, and what it accepts
// encodes back to the same bytes with a valid hint.
func FuzzDecodeVectorMeta(f *testing.F) {
	f.Add(EncodeVectorMeta(VectorMeta{ModelHint: "llama"}))
	f.Add([]byte("SVMD\x01\x00\xff\xff"))
	f.Add([]byte("SVMD\x01\x00\x01\x00\x07"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := DecodeVectorMeta(b)
		if err != nil {
			return
		}
		if n > len(b) || CheckModelHint(m.ModelHint) != nil || string(EncodeVectorMeta(m)) != string(b[:n]) {
			t.Fatalf("accepted %q as %q (%d bytes)", b, m.ModelHint, n)
		}
	})
}
