package mirror

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// TestMirrorModelHint: a steering vector's model hint travels with it inside the authenticated
// value; a hint changed in the bucket (tag kept) is refused and changes nothing; a value
// without metadata (as hosts wrote before hints were mirrored) is still a vector, without a
// hint; a bad hint under a valid tag is refused.
func TestMirrorModelHint(t *testing.T) {
	n := startNATS(t)
	secret := newSecret()
	hs := startHosts(t, n, secret, []string{"a", "b"}, hostOpts{})
	a, b := hs[0], hs[1]
	a.owner.ok("reghint hinted 5 1 llama")
	require.Equal(t, "ok true", a.owner.do("drain"))
	eventually(t, b.worker, "hint hinted", "ok 5/1 llama", 20*time.Second, "the hint on b")
	a.owner.ok("reg hinted 6 1") // registered again without one: the new version has none
	require.Equal(t, "ok true", a.owner.do("drain"))
	eventually(t, b.worker, "hint hinted", "ok 6/1", 20*time.Second, "the hint dropped on b")
	a.owner.ok("reghint hinted 7 1 llama")
	require.Equal(t, "ok true", a.owner.do("drain"))
	eventually(t, b.worker, "hint hinted", "ok 7/1 llama", 20*time.Second, "the hint back on b")

	kv, _, ctx := bucketOf(t, n)
	ek := vectorEntry("hinted")
	got, err := kv.Get(ctx, ek)
	require.NoError(t, err)
	val := got.Value()
	i := bytes.Index(val, []byte("llama"))
	require.Positive(t, i, "the hint is in a's value")
	require.Less(t, i, bytes.Index(val, []byte("SSTR")), "in front of the steering encoding")
	before := b.owner.status()

	// The hint changed in place, everything else (the tag too) as a wrote it.
	forged := bytes.Clone(val)
	copy(forged[i:], "gemma")
	_, err = kv.Put(ctx, ek, forged)
	require.NoError(t, err)
	// And a value signed by someone without the secret.
	payload := append(steer.EncodeVectorMeta(steer.VectorMeta{ModelHint: "gemma"}), vectorPayload(t, 8)...)
	_, err = kv.Put(ctx, ek, forge(ek, kindVector, 0, "a", payload))
	require.NoError(t, err)
	st := waitCount(t, b.owner, func(s Status) uint64 { return s.Tampered }, before.Tampered+2, "both forged hints refused on b")
	require.Equal(t, before.Applied, st.Applied, "%+v", st)
	require.Equal(t, "ok 7/1 llama", b.worker.do("hint hinted"), "b keeps the vector and its hint")

	// Under this deployment's tag: a value without metadata applies as a vector without a
	// hint; one whose hint is not printable is refused.
	_, err = kv.Put(ctx, vectorEntry("plain"), forgeWithSecret(secret, vectorEntry("plain"), kindVector, 0, "z", vectorPayload(t, 9)))
	require.NoError(t, err)
	eventually(t, b.worker, "hint plain", "ok 9/1", 20*time.Second, "a value without metadata on b")
	bad := append(steer.EncodeVectorMeta(steer.VectorMeta{ModelHint: "two lines"}), vectorPayload(t, 10)...)
	bad[bytes.Index(bad, []byte(" lines"))] = '\n'
	_, err = kv.Put(ctx, vectorEntry("plain"), forgeWithSecret(secret, vectorEntry("plain"), kindVector, 0, "z", bad))
	require.NoError(t, err)
	st = waitCount(t, b.owner, func(s Status) uint64 { return s.Rejected }, before.Rejected+1, "a bad hint refused on b")
	require.Contains(t, st.LastError, "bad model hint")
	require.Equal(t, "ok 9/1", b.worker.do("hint plain"), "nothing changed on b")
}
