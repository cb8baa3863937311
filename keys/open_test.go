package keys

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/stretchr/testify/require"
)

// A worker learns the owner's MaxKeyBytes when it attaches: an oversize Set is ErrTooLarge
// there, before any RPC (it stays ErrTooLarge once the owner is gone, when every RPC is
// ErrOwnerGone), and a key of exactly the bound still reaches the owner.
func TestWorkerKnowsMaxKeyBytes(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.MaxKeyBytes = 100
	o := newTestOwner(t, opts)
	c := attach(t, env.clientOpts())
	require.Equal(t, 100, c.reg.MaxKeyBytes())
	require.Equal(t, 100, o.reg.MaxKeyBytes())
	require.NoError(t, c.reg.Set("at-bound", make([]byte, 100)))
	require.ErrorIs(t, c.reg.Set("over", make([]byte, 101)), ErrTooLarge)

	require.NoError(t, o.Close())
	require.ErrorIs(t, c.reg.Set("small", []byte("k")), ipc.ErrOwnerGone, "writes are RPCs")
	err := c.reg.Set("over", make([]byte, 101))
	require.ErrorIs(t, err, ErrTooLarge, "refused before any RPC")
	require.NotErrorIs(t, err, ipc.ErrOwnerGone)
	_, err = c.reg.Get("at-bound", nil)
	require.NoError(t, err, "reads go on from the mapping")
}

// Open checks its options and the owner; Attach to an owner that never called Open says so.
func TestOpenAndAttachErrors(t *testing.T) {
	env := newTestEnv()
	oo := env.ownerOpts()
	o, err := ipc.NewOwner(oo.OwnerOptions)
	require.NoError(t, err)
	t.Cleanup(func() { o.Close() })

	c, err := ipc.Attach(env.clientOpts())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = Attach(c)
	require.ErrorIs(t, err, ipc.ErrUnknownOp)
	require.ErrorContains(t, err, "keys.Open", "says what the owner is missing")

	for name, opt := range map[string]Options{
		"negative key bound": {MaxKeyBytes: -1},
		"key over a frame":   {MaxKeyBytes: o.MaxPayload()},
		"negative grace":     {Grace: -time.Second},
	} {
		_, err := Open(o, opt)
		require.ErrorIs(t, err, shm.ErrBadConfig, name)
	}
	k, err := Open(o, Options{MaxKeyBytes: o.MaxPayload() - 2 - MaxRequestIDLen, Logger: quietLogger()})
	require.NoError(t, err, "the largest key a key set's frame holds")
	_, err = Open(o, Options{})
	require.ErrorIs(t, err, shm.ErrBadConfig, "a second registry on one owner")
	require.True(t, strings.Contains(err.Error(), "twice"), err.Error())

	reg, err := Attach(c)
	require.NoError(t, err, "once the owner serves keys")
	require.Equal(t, k.MaxKeyBytes(), reg.MaxKeyBytes())
}

// The purge loop ends with the owner (ipc.Owner.OnClose, before the region is unmapped): it
// runs while the owner serves and is gone once Close returns; the owner's registry is then
// forgotten, so a new owner of the namespace opens one again.
func TestRegistryEndsWithOwner(t *testing.T) {
	purging := func() bool {
		buf := make([]byte, 1<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "keys.(*local).purgeLoop")
	}
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Grace = 50 * time.Millisecond
	o := newTestOwner(t, opts)
	require.NoError(t, o.reg.Set("a", []byte("k")))
	require.NoError(t, o.reg.Remove("a"))
	require.Eventually(t, purging, 5*time.Second, time.Millisecond, "the purge loop runs while the owner serves")
	require.NoError(t, o.Close())
	require.Eventually(t, func() bool { return !purging() }, 5*time.Second, time.Millisecond, "the purge loop outlived its owner")
	o2 := newTestOwner(t, opts)
	require.NoError(t, o2.reg.Set("a", []byte("k2")))
	got, err := o2.reg.Get("a", nil)
	require.NoError(t, err)
	require.Equal(t, "k2", string(got))
}

// A registry prints what it belongs to, never a key.
func TestRegistryPrintsNoKey(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	c := attach(t, env.clientOpts())
	require.NoError(t, o.reg.Set("req", []byte("KEY-BYTES-xyz")))
	for _, k := range []*Registry{o.reg.Registry, c.reg.Registry} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
			out := sprintf(verb, k) + sprintf(verb, *k)
			require.NotContains(t, out, "KEY-BYTES")
			require.NotContains(t, out, env.secretStr)
			require.Contains(t, out, "keys.Registry{in ipc.")
		}
	}
}
