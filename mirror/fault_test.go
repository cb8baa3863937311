package mirror

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// TestMirrorTamperedKeys: a bucket reader sees only ciphertext; a modified value, a value
// moved to another entry and one sealed with another secret are rejected and counted, and
// the worker keeps reading the last valid key.
func TestMirrorTamperedKeys(t *testing.T) {
	n := startNATS(t)
	secret := newSecret()
	hs := startHosts(t, n, secret, []string{"a", "b"}, hostOpts{keys: true})
	a, b := hs[0], hs[1]
	keyHex := fmt.Sprintf("%x", "very-secret-key-bytes")
	a.owner.OK("setkey req-tamper " + keyHex)
	a.owner.OK("setkey req-other " + fmt.Sprintf("%x", "other-key"))
	eventually(t, b.worker, "key req-tamper", "ok "+keyHex, 20*time.Second, "the key")
	eventually(t, b.worker, "key req-other", "ok "+fmt.Sprintf("%x", "other-key"), 20*time.Second, "the other key")

	nc, err := nats.Connect(n.url())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, DefaultBucket)
	require.NoError(t, err)
	keys, err := kv.Keys(ctx)
	require.NoError(t, err)
	var sealed []jetstream.KeyValueEntry
	for _, k := range keys {
		if strings.HasPrefix(k, "k.") {
			e, err := kv.Get(ctx, k)
			require.NoError(t, err)
			require.NotContains(t, string(e.Value()), "very-secret-key-bytes", "bucket readers see ciphertext only")
			require.NotContains(t, string(e.Value()), "req-tamper", "nor the request id")
			require.NotContains(t, k, "req-tamper")
			sealed = append(sealed, e)
		}
	}
	require.Len(t, sealed, 2)
	ss := testSealer(t, 5) // another secret
	target := sealed[0]
	flipped := bytes.Clone(target.Value())
	flipped[len(flipped)-5] ^= 0x40
	env, hdr, err := decodeEnvelope(target.Value())
	require.NoError(t, err)
	forged := append(bytes.Clone(target.Value()[:hdr]), ss.seal(target.Key(), target.Value()[:hdr], "req-tamper", stateLive, []byte("forged"))...)
	require.Equal(t, kindKey, env.kind)

	before := b.owner.status().Tampered
	for i, bad := range []struct {
		ek  string
		val []byte
	}{
		{target.Key(), flipped},
		{target.Key(), sealed[1].Value()}, // another entry's valid value, moved
		{target.Key(), forged},
	} {
		_, err := kv.Put(ctx, bad.ek, bad.val)
		require.NoError(t, err)
		deadline := time.Now().Add(20 * time.Second)
		for b.owner.status().Tampered != before+uint64(i+1) {
			require.True(t, time.Now().Before(deadline), "tampered value %d not counted", i)
			time.Sleep(5 * time.Millisecond)
		}
	}
	// The last valid values stand.
	require.Equal(t, "ok "+keyHex, b.worker.Do("key req-tamper"))
	require.Equal(t, "ok "+fmt.Sprintf("%x", "other-key"), b.worker.Do("key req-other"))
	st := b.owner.status()
	require.Contains(t, st.LastError, "authentication")
	require.NotContains(t, st.LastError, "very-secret")
	// A valid change after the tampering is applied again.
	a.owner.OK("setkey req-tamper " + fmt.Sprintf("%x", "next"))
	eventually(t, b.worker, "key req-tamper", "ok "+fmt.Sprintf("%x", "next"), 20*time.Second, "a key after tampering")
}

// TestMirrorQueueFull: with NATS unreachable, local writes go on; changes queue up to
// QueueLimit distinct entries (repeats coalesce); beyond, ErrQueueFull is counted and
// returned (keys), and the local state is unaffected.
func TestMirrorQueueFull(t *testing.T) {
	cfg := steer.ModelConfig{Hidden: 16, Layers: 2}
	rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 1 << 10, ArenaBytes: 4 << 20, ReaderSlots: 16})
	require.NoError(t, err)
	secret := ipc.NewSecret([]byte(newSecret()))
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: "mirror-qf-" + newSecret(), Region: rc, Logger: quiet()})
	require.NoError(t, err)
	defer owner.Close()
	reg, err := keys.Open(owner, keys.Options{})
	require.NoError(t, err)
	eng, err := steer.Open(owner.Region(), &cfg, steer.Options{})
	require.NoError(t, err)
	m, err := Start(context.Background(), Options{URL: fmt.Sprintf("nats://127.0.0.1:%d", freePort(t)), HostID: "solo",
		MirrorKeys: true, Secret: &secret, Engine: eng, Keys: reg, QueueLimit: 3, Logger: quiet()})
	require.NoError(t, err, "Start does not wait for NATS")
	defer m.Close()

	vec := []steer.Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: make([]float32, 16)}}
	for i := range 5 {
		_, err := eng.Register(fmt.Sprintf("v%d", i), vec)
		require.NoError(t, err, "local writes go on")
	}
	for range 3 { // repeats of a queued entry take no more room (v0 may be in a publish attempt)
		_, err := eng.Register("v1", vec)
		require.NoError(t, err)
	}
	require.NoError(t, reg.Set("req", []byte("k")), "a full queue never fails the local write")
	got, err := reg.Get("req", nil)
	require.NoError(t, err)
	require.Equal(t, "k", string(got), "the local write stands")

	st := m.Status()
	require.False(t, st.Connected)
	require.Equal(t, 3, st.QueueDepth)
	require.EqualValues(t, 3, st.QueueFull) // v3, v4 and the key
	require.Zero(t, st.Published)
	s, err := owner.Region().Snapshot()
	require.NoError(t, err)
	infos, err := eng.VectorInfos(&s)
	s.Close()
	require.NoError(t, err)
	require.Len(t, infos, 5)

	_, err = Start(context.Background(), Options{URL: "nats://127.0.0.1:1", Engine: eng, MirrorKeys: true})
	require.ErrorIs(t, err, ErrBadOptions, "MirrorKeys without a secret")
	_, err = Start(context.Background(), Options{Engine: eng})
	require.ErrorIs(t, err, ErrBadOptions, "no URL")
}

// TestMirrorKeyPurge: a revoked key's tombstone is purged from the bucket after KeyPurgeAfter
// and its marker removed, so the bucket does not keep every request ever served; a host that
// was away meanwhile finds the entry gone on its resync and revokes the key.
func TestMirrorKeyPurge(t *testing.T) {
	n := startNATS(t)
	hs := startHosts(t, n, newSecret(), []string{"a", "b"}, hostOpts{keys: true, proxy: true, purge: 300 * time.Millisecond})
	a, b := hs[0], hs[1]
	for _, id := range []string{"r1", "r2"} {
		a.owner.OK(fmt.Sprintf("setkey %s %x", id, id))
		eventually(t, b.worker, "key "+id, fmt.Sprintf("ok %x", id), 20*time.Second, "key "+id)
	}
	a.owner.OK("rmkey r1")
	eventually(t, b.worker, "key r1", "err revoked", 20*time.Second, "a revocation")

	b.proxy.setCut(true)
	a.owner.OK("rmkey r2")
	require.Equal(t, "ok true", a.owner.Do("drain"))
	kv, _, ctx := bucketOf(t, n)
	waitBucketEmpty(t, kv, ctx)
	require.Equal(t, fmt.Sprintf("ok %x", "r2"), b.worker.Do("key r2"), "b was away: it still holds r2")
	b.proxy.setCut(false)
	eventually(t, b.worker, "key r2", "err revoked", 20*time.Second, "a revocation whose tombstone was purged while b was away")
	st := b.owner.status()
	require.Zero(t, st.Rejected+st.Tampered, "%+v", st)

	for _, h := range hs { // nothing is remembered of purged key entries
		eventually(t, h.owner, "entries", "ok 0", 20*time.Second, "entries known on "+h.id)
	}
	// The id can be used again.
	a.owner.OK(fmt.Sprintf("setkey r2 %x", "again"))
	eventually(t, b.worker, "key r2", fmt.Sprintf("ok %x", "again"), 20*time.Second, "a key set again after its purge")
}

// TestMirrorConversationPurge: a dropped conversation's tombstone is purged from the bucket
// after KeyPurgeAfter, as a revoked key's is, and no host remembers the entry after; a host
// that was away meanwhile finds the entry gone on its resync and drops the conversation.
func TestMirrorConversationPurge(t *testing.T) {
	n := startNATS(t)
	hs := startHosts(t, n, newSecret(), []string{"a", "b"}, hostOpts{proxy: true, purge: 300 * time.Millisecond})
	a, b := hs[0], hs[1]
	for _, id := range []string{"c1", "c2"} {
		a.owner.OK("mkconv " + id)
		eventually(t, b.owner, "conv - "+id, a.owner.Do("conv - "+id), 20*time.Second, "conversation "+id)
	}
	require.Equal(t, "true", a.owner.OK("dropconv c1"))
	eventually(t, b.owner, "conv - c1", "none", 20*time.Second, "a dropped conversation")

	b.proxy.setCut(true)
	require.Equal(t, "true", a.owner.OK("dropconv c2"))
	require.Equal(t, "ok true", a.owner.Do("drain"))
	kv, _, ctx := bucketOf(t, n)
	waitBucketEmpty(t, kv, ctx)
	require.True(t, strings.HasPrefix(b.owner.Do("conv - c2"), "ok"), "b was away: it still holds c2")
	b.proxy.setCut(false)
	eventually(t, b.owner, "conv - c2", "none", 20*time.Second, "a conversation whose tombstone was purged while b was away")
	st := b.owner.status()
	require.Zero(t, st.Rejected+st.Tampered, "%+v", st)
	for _, h := range hs { // nothing is remembered of purged conversation entries
		eventually(t, h.owner, "entries", "ok 0", 20*time.Second, "entries known on "+h.id)
	}
	// The conversation can come back.
	a.owner.OK("mkconv c2")
	eventually(t, b.owner, "conv - c2", a.owner.Do("conv - c2"), 20*time.Second, "a conversation again after its purge")
}

// waitBucketEmpty waits until the bucket holds no value (tombstones and markers purged).
func waitBucketEmpty(t *testing.T, kv jetstream.KeyValue, ctx context.Context) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := kv.Status(ctx)
		require.NoError(t, err)
		if st.Values() == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the bucket still holds %d values", st.Values())
		time.Sleep(50 * time.Millisecond)
	}
}
