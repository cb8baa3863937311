package keys

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every key write the owner makes is announced to the registry's observers, whichever process
// asked: the owner itself (with its origin tag) and a client over RPC (no tag, as Python's and
// the C ABI's writes reach it). A KeyIf condition runs under the write lock and its error aborts
// the write; a revocation of an id already revoked announces nothing; a client cannot tag.
func TestKeyChangeHook(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	var mu sync.Mutex
	var got []Change
	remove := o.reg.OnChange(func(c Change) {
		mu.Lock()
		got = append(got, c)
		mu.Unlock()
	})
	c := attach(t, env.clientOpts())

	require.NoError(t, o.reg.Set("a", []byte("ka"), Origin("mirror")))
	require.NoError(t, c.reg.Set("b", []byte("kb")))
	require.NoError(t, c.reg.Remove("b"))
	require.NoError(t, c.reg.Remove("b")) // already revoked: no change
	errNo := errors.New("give way")
	require.ErrorIs(t, o.reg.Set("c", []byte("kc"), If(func() error { return errNo })), errNo)
	_, err := o.reg.Get("c", nil)
	require.ErrorIs(t, err, ErrNotFound, "a refused condition writes nothing")
	require.Error(t, c.reg.Set("d", []byte("kd"), Origin("x")), "a client cannot tag its writes")
	require.NoError(t, o.reg.Remove("a", If(func() error { return nil })))

	mu.Lock()
	require.Equal(t, []Change{
		{RequestID: "a", Origin: "mirror"},
		{RequestID: "b"},
		{RequestID: "b", Revoked: true},
		{RequestID: "a", Revoked: true},
	}, got)
	mu.Unlock()
	remove()
	require.NoError(t, c.reg.Set("e", []byte("ke")))
	mu.Lock()
	require.Len(t, got, 4, "a removed observer is not called")
	mu.Unlock()
}
