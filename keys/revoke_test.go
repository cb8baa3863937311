package keys

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/stretchr/testify/require"
)

// TestRevokeWhenFull: with the arena full of live keys, every key can still be revoked, and
// readers (in the owner and in a client) see ErrRevoked, not the key.
func TestRevokeWhenFull(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Grace = time.Hour
	opts.Region = shm.Config{IndexSlots: 4096, ArenaBytes: 256 << 10, ReaderSlots: 16, MarkSlots: 4096}
	o := newTestOwner(t, opts)
	c := attach(t, env.clientOpts())
	key := make([]byte, 200)
	var ids []string
	var full error
	for i := 0; full == nil; i++ {
		id := fmt.Sprintf("req-%05d", i)
		if full = o.reg.Set(id, key); full == nil {
			ids = append(ids, id)
		}
	}
	require.ErrorIs(t, full, shm.ErrRegionFull)
	require.Contains(t, full.Error(), "ArenaBytes", "says which setting to raise")
	require.Greater(t, len(ids), 100)
	for i, id := range ids {
		k := o.reg.Registry
		if i%2 == 1 {
			k = c.reg.Registry
		}
		require.NoError(t, k.Remove(id), "revoke %d of %d with the arena full", i, len(ids))
	}
	for _, k := range []*Registry{o.reg.Registry, c.reg.Registry} {
		for _, id := range ids {
			_, err := k.Get(id, nil)
			require.ErrorIs(t, err, ErrRevoked, id)
		}
		n, revoked, err := k.Count()
		require.NoError(t, err)
		require.Equal(t, len(ids), n)
		require.Equal(t, len(ids), revoked)
	}
	require.Zero(t, o.reg.RevokedWithoutSentinel())
	require.NoError(t, o.reg.Set("fresh", key), "room again once the revoked keys are reclaimed")
}

// TestRevocationCapacityDefaults: the default region holds the sentinels of 5,000 revocations
// a second over the default 60 s grace (300,000) while new keys keep being set.
func TestRevocationCapacityDefaults(t *testing.T) {
	n := 300_000
	if testing.Short() {
		n = 30_000
	}
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Region = shm.Config{} // the defaults
	o := newTestOwner(t, opts)
	k := o.reg
	key := make([]byte, 32)
	start := time.Now()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", i) // request-id shaped
		require.NoError(t, k.Set(id, key), "set %d", i)
		require.NoError(t, k.Remove(id), "revoke %d", i)
	}
	took := time.Since(start)
	_, revoked, err := k.Count()
	require.NoError(t, err)
	require.Equal(t, n, revoked, "every sentinel stands (grace 60 s)")
	require.Zero(t, o.reg.RevokedWithoutSentinel())
	for i := 0; i < 1000; i++ {
		require.NoError(t, k.Set(fmt.Sprintf("live-%d", i), key), "new keys still fit")
	}
	_, err = k.Get(fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", n-1), nil)
	require.ErrorIs(t, err, ErrRevoked)
	t.Logf("%d set+revoke pairs in %v (%.0f revokes/s, owner side); mark table %d of %d entries",
		n, took, float64(n)/took.Seconds(), o.Region().Stats().MarkEntries, o.Region().Stats().MarkSlots)
}

// BenchmarkRevoke measures an owner's Set followed by Remove on a fresh id, at the defaults.
func BenchmarkRevoke(b *testing.B) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Region = shm.Config{}
	o := newTestOwner(b, opts)
	key := make([]byte, 32)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", i)
		if err := o.reg.Set(id, key); err != nil {
			b.Fatal(err)
		}
		if err := o.reg.Remove(id); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRevokeWithMarkTableFull: past a full mark table, revocations keep their sentinel in the
// arena, so readers in another process still get ErrRevoked (they used to get
// ErrNotFound: the revocation silently looked like an unknown id), the sentinels are purged
// after the grace, and the warning is rate-limited (it was logged once per revocation).
func TestRevokeWithMarkTableFull(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Grace = 2 * time.Second
	opts.Region = shm.Config{IndexSlots: 4096, ArenaBytes: 4 << 20, ReaderSlots: 16, MarkSlots: 64}
	var logs syncBuffer
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	o := newTestOwner(t, opts)
	const n = 500
	for i := range n {
		require.NoError(t, o.reg.Set(fmt.Sprintf("req-%d", i), []byte("key")))
	}
	kid := startClient(t, env)
	require.Equal(t, "ok ready", kid.Line())
	for i := range n {
		require.NoError(t, o.reg.Remove(fmt.Sprintf("req-%d", i)))
	}
	require.Positive(t, o.reg.RevokedInArena(), "the mark table (64 entries) filled")
	require.Zero(t, o.reg.RevokedWithoutSentinel())
	for i := range n {
		require.Equal(t, "err ErrRevoked", kid.Do(fmt.Sprintf("get req-%d", i)), "req-%d", i)
	}
	var revoked int
	require.NoError(t, o.reg.Range(func(_ string, r bool) bool {
		if r {
			revoked++
		}
		return true
	}))
	require.Equal(t, n, revoked, "the owner lists every revoked id, marked or in the arena")
	warnings := strings.Count(logs.String(), "mark table is full")
	require.Positive(t, warnings)
	require.LessOrEqual(t, warnings, 10, "rate-limited: not one warning per revocation")
	require.NoError(t, o.reg.Set("req-0", []byte("again")), "an arena sentinel is lifted by a set")
	require.Equal(t, "ok "+hexOf("again"), kid.Do("get req-0"))

	require.Eventually(t, func() bool { return kid.Do("get req-1") == "err ErrNotFound" },
		20*time.Second, 20*time.Millisecond, "sentinels are purged after the grace")
	require.Eventually(t, func() bool { return kid.Do(fmt.Sprintf("get req-%d", n-1)) == "err ErrNotFound" },
		20*time.Second, 20*time.Millisecond)
	require.Equal(t, "ok "+hexOf("again"), kid.Do("get req-0"), "the purge spares a key set again")
	kid.Exit()
}
