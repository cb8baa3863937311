package keys

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Two client processes: one writes and revokes over RPC, the other reads from its mapping; the
// owner purges each sentinel after the grace, and a key set again is spared by its older timer.
func TestProcRevokePurge(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Grace = 300 * time.Millisecond
	o := newTestOwner(t, opts)
	reader := startClient(t, env)
	writer := startClient(t, env)
	require.Equal(t, "ok ready", reader.Line())
	require.Equal(t, "ok ready", writer.Line())

	require.NoError(t, o.reg.Set("req", []byte("k1")))
	require.Equal(t, "ok", writer.Do("set again "+hexOf("k2")))
	require.Equal(t, "ok "+hexOf("k1"), reader.Do("get req"))

	// "again" is removed first, so its old purge is due before "req"'s.
	require.Equal(t, "ok", writer.Do("remove again"))
	require.Equal(t, "ok", writer.Do("remove req"))
	require.Equal(t, "err ErrRevoked", reader.Do("get req"))
	require.Equal(t, "err ErrRevoked", reader.Do("get again"))
	_, err := o.reg.Get("req", nil)
	require.ErrorIs(t, err, ErrRevoked)
	require.Equal(t, "ok 2", reader.Do("len"))
	require.Equal(t, "ok", writer.Do("set again "+hexOf("k3"))) // cancels its purge

	require.Eventually(t, func() bool { return reader.Do("get req") == "err ErrNotFound" },
		20*time.Second, 10*time.Millisecond, "the sentinel is purged after the grace")
	require.Equal(t, "ok "+hexOf("k3"), reader.Do("get again"), "a key set again is not purged by the older timer")
	require.Equal(t, "ok 1", reader.Do("len"))
	require.Equal(t, "err ErrNotFound", writer.Do("remove req"))
}
