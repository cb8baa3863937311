package steer

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOnChange(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	var got []Change
	remove := e.OnChange(func(c Change) { got = append(got, c) })
	rng := rand.New(rand.NewPCG(1, 2))
	vec := []Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: randVec(rng, smallCfg.Hidden)}}

	info, err := e.Register("a", vec)
	require.NoError(t, err)
	_, err = e.Register("b", vec, Origin("mirror"), If(func() error { return nil }))
	require.NoError(t, err)
	errNo := errors.New("no")
	_, err = e.Register("c", vec, Origin("mirror"), If(func() error { return errNo }))
	require.ErrorIs(t, err, errNo, "a failed condition aborts the write")
	_, err = e.Register("", vec)
	require.ErrorIs(t, err, ErrBadName, "a failed write notifies nobody")
	gv, err := e.SetGlobal(Steering{Base: Tier{Refs: []Ref{{Name: "a", Strength: 1}}}})
	require.NoError(t, err)
	_, err = e.Unregister("b", Origin("mirror"), If(func() error { return errNo }))
	require.ErrorIs(t, err, errNo)
	_, err = e.SetGlobal(Steering{}, Origin("x"), If(func() error { return errNo }))
	require.ErrorIs(t, err, errNo)
	uv, err := e.Unregister("b", Origin("mirror"))
	require.NoError(t, err)
	_, err = e.Unregister("missing")
	require.ErrorIs(t, err, ErrUnknownVector)
	cv, err := e.SetGlobal(Steering{}, Origin("x"))
	require.NoError(t, err)

	require.Equal(t, []Change{
		{Kind: ChangeVector, Name: "a", Version: info.Version},
		{Kind: ChangeVector, Name: "b", Version: info.Version + 1, Origin: "mirror"},
		{Kind: ChangeGlobal, Version: gv},
		{Kind: ChangeVector, Name: "b", Deleted: true, Version: uv, Origin: "mirror"},
		{Kind: ChangeGlobal, Deleted: true, Version: cv, Origin: "x"},
	}, got)

	s, err := e.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	b, v, found, err := e.Encoding(&s, ChangeVector, "a")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, info.Version, v)
	st, d, err := DecodeSteering(b, smallCfg)
	require.NoError(t, err)
	require.Equal(t, info.Digest, d)
	require.Equal(t, vec[0].Data, st.Base.Vectors[0].Data)
	_, _, found, err = e.Encoding(&s, ChangeVector, "c")
	require.NoError(t, err)
	require.False(t, found, "c was never written")
	_, _, found, err = e.Encoding(&s, ChangeVector, "b")
	require.NoError(t, err)
	require.False(t, found)
	_, _, found, err = e.Encoding(&s, ChangeGlobal, "")
	require.NoError(t, err)
	require.False(t, found, "global steering was cleared")

	remove()
	_, err = e.Register("c", vec)
	require.NoError(t, err)
	require.Len(t, got, 5, "a removed observer is not called")
}
