package mirror

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
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
	a.owner.OK("reghint hinted 5 1 llama")
	require.Equal(t, "ok true", a.owner.Do("drain"))
	eventually(t, b.worker, "hint hinted", "ok 5/1 llama", 20*time.Second, "the hint on b")
	a.owner.OK("reg hinted 6 1") // registered again without one: the new version has none
	require.Equal(t, "ok true", a.owner.Do("drain"))
	eventually(t, b.worker, "hint hinted", "ok 6/1", 20*time.Second, "the hint dropped on b")
	a.owner.OK("reghint hinted 7 1 llama")
	require.Equal(t, "ok true", a.owner.Do("drain"))
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
	// (One at a time: the bucket keeps one value per entry, so a watch may skip a value
	// replaced before it was delivered.)
	waitCount(t, b.owner, func(s Status) uint64 { return s.Tampered }, before.Tampered+1, "the changed hint refused on b")
	// And a value signed by someone without the secret.
	payload := append(steer.EncodeVectorMeta(steer.VectorMeta{ModelHint: "gemma"}), vectorPayload(t, 8)...)
	_, err = kv.Put(ctx, ek, forge(ek, kindVector, 0, "a", payload))
	require.NoError(t, err)
	st := waitCount(t, b.owner, func(s Status) uint64 { return s.Tampered }, before.Tampered+2, "both forged hints refused on b")
	require.Equal(t, before.Applied, st.Applied, "%+v", st)
	require.Equal(t, "ok 7/1 llama", b.worker.Do("hint hinted"), "b keeps the vector and its hint")

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
	require.Equal(t, "ok 9/1", b.worker.Do("hint plain"), "nothing changed on b")
}

// convPayload is conversation k's rest_of_conversation gates entry as an owner encodes it (an
// inline probe and add: no named vector needed), and its length.
// convAdmission admits request id in conversation k with a rest_of_conversation gate, which
// gives k an entry in the owner's conversation table.
func convAdmission(id string, k steer.ConvKey) steer.Admission {
	v := make([]float32, testCfg.Hidden)
	v[0] = 1
	src := steer.GateSource{Vectors: []steer.Vector{{Hook: steer.DefaultHooks[0], Layer: 1, Scale: 1, Data: v}}}
	return steer.Admission{RequestID: id, Conversation: k, Gates: []steer.Gate{{
		When:  steer.When{Kind: steer.WhenProbe, Probe: src, Threshold: 0.5, Sharpness: 1},
		Scope: steer.ScopeRestOfConversation, Apply: steer.GateApply{Kind: steer.ApplyAdd, Steer: src, Strength: 1}}}}
}

func convPayload(t *testing.T, k steer.ConvKey) []byte {
	rc, err := steer.RegionConfig(testCfg, shm.Config{IndexSlots: 64, ArenaBytes: 4 << 20, ReaderSlots: 4})
	require.NoError(t, err)
	r, err := shm.Create(rc)
	require.NoError(t, err)
	defer r.Close()
	eng, err := steer.Open(r, &testCfg, steer.Options{})
	require.NoError(t, err)
	_, err = eng.Admit(convAdmission("r", k))
	require.NoError(t, err)
	b, found, err := eng.GateConversation(k)
	require.NoError(t, err)
	require.True(t, found)
	return b
}

// TestMirrorConversationEntries: a conversation's gates entry is applied only under this
// deployment's tag and only when its value names its entry's conversation; a forged, moved or
// malformed one is refused and changes nothing.
func TestMirrorConversationEntries(t *testing.T) {
	n := startNATS(t)
	secret := newSecret()
	hs := startHosts(t, n, secret, []string{"a", "b"}, hostOpts{})
	b := hs[1]
	kv, _, ctx := bucketOf(t, n)
	chat := steer.ConvKey{ID: "chat"}
	ek := conversationEntry(steer.GateConversationName(chat))
	payload := convPayload(t, chat)
	before := b.owner.status()

	_, err := kv.Put(ctx, ek, forge(ek, kindConversation, 0, "x", payload))
	require.NoError(t, err)
	waitCount(t, b.owner, func(s Status) uint64 { return s.Tampered }, before.Tampered+1, "a forged entry refused")
	require.Equal(t, "none", b.owner.Do("conv - chat"))

	other := convPayload(t, steer.ConvKey{ID: "other"}) // a valid value of another conversation, moved here
	_, err = kv.Put(ctx, ek, forgeWithSecret(secret, ek, kindConversation, 0, "z", other))
	require.NoError(t, err)
	waitCount(t, b.owner, func(s Status) uint64 { return s.Rejected }, before.Rejected+1, "a moved entry refused")
	_, err = kv.Put(ctx, conversationEntry(steer.GateConversationName(steer.ConvKey{ID: "cut"})),
		forgeWithSecret(secret, conversationEntry(steer.GateConversationName(steer.ConvKey{ID: "cut"})), kindConversation, 0, "z", payload[:len(payload)-1]))
	require.NoError(t, err)
	st := waitCount(t, b.owner, func(s Status) uint64 { return s.Rejected }, before.Rejected+2, "a moved and a cut entry refused")
	require.Equal(t, "none", b.owner.Do("conv - chat"))
	require.Equal(t, "none", b.owner.Do("conv - other"))
	require.Equal(t, "none", b.owner.Do("conv - cut"))
	require.Equal(t, before.Applied, st.Applied)

	_, err = kv.Put(ctx, ek, forgeWithSecret(secret, ek, kindConversation, 0, "z", payload))
	require.NoError(t, err)
	eventually(t, b.owner, "conv - chat", fmt.Sprintf("ok %d", len(payload)), 20*time.Second, "a valid entry applied on b")
	st = b.owner.status()
	require.Equal(t, before.RemoteEntries, st.RemoteEntries, "the table is bounded by the latch caps, not charged to the region's remote bound")
	require.Equal(t, before.RemoteBytes, st.RemoteBytes)
}
