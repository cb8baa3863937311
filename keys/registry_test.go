package keys

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/stretchr/testify/require"
)

// An owner's key is read by a client from its mapping, a client's Set reaches the owner over
// RPC, and a client cannot write the region itself.
func TestAttachReadWrite(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	require.NoError(t, o.reg.Set("req-1", []byte("key-one")))

	c := attach(t, env.clientOpts())
	got, err := c.reg.Get("req-1", nil)
	require.NoError(t, err)
	require.Equal(t, "key-one", string(got))

	require.NoError(t, c.reg.Set("req-2", []byte("key-two")))
	got, err = o.reg.Get("req-2", []byte("prefix:"))
	require.NoError(t, err)
	require.Equal(t, "prefix:key-two", string(got))

	_, err = c.Region().Put(Kind, "x", []byte{1})
	require.ErrorIs(t, err, shm.ErrReadOnly, "a client's region is read-only")

	n, _, err := c.reg.Count()
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

// TestOwnerSetAllocatesNothing: the owner's Set of a live key, with no options, allocates
// nothing (shm's Update reuses its Tx): a stream of Sets gives the garbage collector no work,
// whose cycles made most of the owner's Set tail.
func TestOwnerSetAllocatesNothing(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	ids := benchKeys(64)
	key := make([]byte, 32)
	for _, id := range ids {
		require.NoError(t, o.reg.Set(id, key))
	}
	i := 0
	allocs := testing.AllocsPerRun(200, func() {
		if err := o.reg.Set(ids[i%len(ids)], key); err != nil {
			t.Fatal(err)
		}
		i++
	})
	require.Zero(t, allocs, "Registry.Set in the owner")
}

func TestRegistrySemantics(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Grace = time.Hour // purges are tested separately
	opts.MaxKeyBytes = 64
	o := newTestOwner(t, opts)
	c := attach(t, env.clientOpts())

	for name, k := range map[string]*Registry{"owner": o.reg.Registry, "client": c.reg.Registry} {
		t.Run(name, func(t *testing.T) {
			id := "req-" + name
			tests := []struct {
				name string
				do   func() error
				want error
			}{
				{"empty id", func() error { return k.Set("", []byte("k")) }, ErrRequestIDTooLong},
				{"long id", func() error { return k.Set(strings.Repeat("x", MaxRequestIDLen+1), []byte("k")) }, ErrRequestIDTooLong},
				{"max id", func() error { return k.Set(strings.Repeat(name[:1], MaxRequestIDLen), []byte("k")) }, nil},
				{"large key", func() error { return k.Set(id, make([]byte, 65)) }, ErrTooLarge},
				{"max key", func() error { return k.Set(id, bytes.Repeat([]byte{7}, 64)) }, nil},
				{"remove unknown", func() error { return k.Remove("nope-" + name) }, ErrNotFound},
				{"get long id", func() error { _, err := k.Get(strings.Repeat("x", 300), nil); return err }, ErrRequestIDTooLong},
			}
			for _, tt := range tests {
				err := tt.do()
				if tt.want == nil {
					require.NoError(t, err, tt.name)
				} else {
					require.ErrorIs(t, err, tt.want, tt.name)
				}
			}
			got, err := k.Get(id, nil)
			require.NoError(t, err)
			require.Equal(t, bytes.Repeat([]byte{7}, 64), got)

			require.NoError(t, k.Remove(id))
			got, err = k.Get(id, []byte("keep"))
			require.ErrorIs(t, err, ErrRevoked)
			require.Equal(t, "keep", string(got))
			require.NoError(t, k.Remove(id), "removing a revoked id again is a no-op")
			_, err = k.Get("never-"+name, nil)
			require.ErrorIs(t, err, ErrNotFound)

			revoked := map[string]bool{}
			require.NoError(t, k.Range(func(id string, r bool) bool { revoked[id] = r; return true }))
			// Sentinels are hashes in the mark table: only the owner, which schedules their
			// purge, can list their ids; Count sees them everywhere.
			rev, seen := revoked[id]
			require.Equal(t, name == "owner", seen && rev, "Range lists revoked ids in the owner only")
			_, nrev, err := k.Count()
			require.NoError(t, err)
			require.GreaterOrEqual(t, nrev, 1)

			require.NoError(t, k.Set(id, []byte("again")), "set after remove")
			got, err = k.Get(id, nil)
			require.NoError(t, err)
			require.Equal(t, "again", string(got))
			require.NoError(t, k.Set(id, nil), "empty key")
			got, err = k.Get(id, nil)
			require.NoError(t, err)
			require.Empty(t, got)
		})
	}
	n, _, err := o.reg.Count()
	require.NoError(t, err)
	require.Equal(t, 4, n)
}

// TestReader checks that a Reader's Get gives Registry.Get's results, in the owner and
// in a client, and that it allocates nothing with a reused buffer.
func TestReader(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Grace = time.Hour
	o := newTestOwner(t, opts)
	c := attach(t, env.clientOpts())
	ok := o.reg
	require.NoError(t, ok.Set("live", []byte("secret-key")))
	require.NoError(t, ok.Set("empty", nil))
	require.NoError(t, ok.Set("revoked", []byte("gone")))
	require.NoError(t, ok.Remove("revoked"))
	maxID := strings.Repeat("m", MaxRequestIDLen)
	require.NoError(t, ok.Set(maxID, []byte("max")))

	tests := []struct {
		name, id string
		dst      []byte
		want     string // the returned bytes
		err      error
	}{
		{"live", "live", nil, "secret-key", nil},
		{"live appends", "live", []byte("pre:"), "pre:secret-key", nil},
		{"empty key", "empty", nil, "", nil},
		{"max id", maxID, nil, "max", nil},
		{"revoked", "revoked", []byte("keep"), "keep", ErrRevoked},
		{"missing", "missing", []byte("keep"), "keep", ErrNotFound},
		{"empty id", "", []byte("keep"), "keep", ErrRequestIDTooLong},
		{"long id", strings.Repeat("x", MaxRequestIDLen+1), []byte("keep"), "keep", ErrRequestIDTooLong},
	}
	for name, k := range map[string]*Registry{"owner": o.reg.Registry, "client": c.reg.Registry} {
		t.Run(name, func(t *testing.T) {
			kr, err := k.NewReader()
			require.NoError(t, err)
			for _, tt := range tests {
				for via, get := range map[string]func(string, []byte) ([]byte, error){"Registry": k.Get, "Reader": kr.Get} {
					got, err := get(tt.id, slices.Clone(tt.dst))
					if tt.err == nil {
						require.NoError(t, err, "%s via %s", tt.name, via)
					} else {
						require.ErrorIs(t, err, tt.err, "%s via %s", tt.name, via)
					}
					require.Equal(t, tt.want, string(got), "%s via %s", tt.name, via)
				}
			}

			buf := make([]byte, 0, 64)
			allocs := testing.AllocsPerRun(100, func() {
				buf, err = kr.Get("live", buf[:0])
			})
			require.NoError(t, err)
			require.Zero(t, allocs, "Reader.Get with a reused buffer")

			require.NoError(t, kr.Close())
			require.ErrorIs(t, kr.Close(), shm.ErrClosed)
			_, err = kr.Get("live", nil)
			require.ErrorIs(t, err, shm.ErrClosed)
		})
	}
}

func TestPurgeAfterGrace(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Grace = 50 * time.Millisecond
	o := newTestOwner(t, opts)
	c := attach(t, env.clientOpts())

	require.NoError(t, c.reg.Set("gone", []byte("k1")))
	require.NoError(t, c.reg.Set("back", []byte("k2")))
	require.NoError(t, c.reg.Remove("gone"))
	require.NoError(t, c.reg.Remove("back"))
	_, err := c.reg.Get("gone", nil)
	require.ErrorIs(t, err, ErrRevoked)
	// Set again before the purge: the older timer must not delete it.
	require.NoError(t, o.reg.Set("back", []byte("k3")))

	require.Eventually(t, func() bool {
		_, err := c.reg.Get("gone", nil)
		return errors.Is(err, ErrNotFound)
	}, 10*time.Second, 5*time.Millisecond)
	// The purge of "gone" ran after "back"'s would have; "back" must still be live.
	got, err := c.reg.Get("back", nil)
	require.NoError(t, err)
	require.Equal(t, "k3", string(got))

	// Remove again: a new sentinel with a new schedule, purged in its turn.
	require.NoError(t, c.reg.Remove("back"))
	require.Eventually(t, func() bool {
		_, err := c.reg.Get("back", nil)
		return errors.Is(err, ErrNotFound)
	}, 10*time.Second, 5*time.Millisecond)
	n, _, err := c.reg.Count()
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestPurgeQueueCancel(t *testing.T) {
	var q purgeQueue
	now := time.Now()
	require.True(t, q.schedule("a", 1, now.Add(3*time.Second)))
	require.True(t, q.schedule("b", 2, now.Add(time.Second)))
	require.False(t, q.schedule("c", 3, now.Add(2*time.Second)))
	q.cancel("b")
	q.cancel("zz")
	require.Equal(t, 2, q.Len())
	require.Equal(t, "c", q.items[0].id)
	q.schedule("a", 4, now) // rescheduled: replaces the old item
	require.Equal(t, 2, q.Len())
	require.Equal(t, uint64(4), q.items[0].version)
}
