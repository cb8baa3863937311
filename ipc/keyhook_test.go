package ipc

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
	var got []KeyChange
	remove := o.Keys().OnChange(func(c KeyChange) {
		mu.Lock()
		got = append(got, c)
		mu.Unlock()
	})
	c := attach(t, env.clientOpts())

	require.NoError(t, o.Keys().Set("a", []byte("ka"), KeyOrigin("mirror")))
	require.NoError(t, c.Keys().Set("b", []byte("kb")))
	require.NoError(t, c.Keys().Remove("b"))
	require.NoError(t, c.Keys().Remove("b")) // already revoked: no change
	errNo := errors.New("give way")
	require.ErrorIs(t, o.Keys().Set("c", []byte("kc"), KeyIf(func() error { return errNo })), errNo)
	_, err := o.Keys().Get("c", nil)
	require.ErrorIs(t, err, ErrKeyNotFound, "a refused condition writes nothing")
	require.Error(t, c.Keys().Set("d", []byte("kd"), KeyOrigin("x")), "a client cannot tag its writes")
	require.NoError(t, o.Keys().Remove("a", KeyIf(func() error { return nil })))

	mu.Lock()
	require.Equal(t, []KeyChange{
		{RequestID: "a", Origin: "mirror"},
		{RequestID: "b"},
		{RequestID: "b", Revoked: true},
		{RequestID: "a", Revoked: true},
	}, got)
	mu.Unlock()
	remove()
	require.NoError(t, c.Keys().Set("e", []byte("ke")))
	mu.Lock()
	require.Len(t, got, 4, "a removed observer is not called")
	mu.Unlock()
	c.Keys().OnChange(func(KeyChange) { t.Error("a client's observer is never called") })()
}
