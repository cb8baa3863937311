package serve

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/gob"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// A state file written before model hints and conversation gates were kept (the payload of
// that build's persisted type) still reads: its vectors have no hint, and there are no
// conversation gates. One written now keeps both.
func TestStateFileBeforeHintsAndConversationGates(t *testing.T) {
	type oldNamedDigest struct {
		Name   string
		Digest steer.Digest
	}
	type oldPersisted struct {
		Model      steer.ModelConfig
		Vectors    []oldNamedDigest
		Probes     []oldNamedDigest
		Global     []byte
		Modules    []namedWire
		Latches    []steer.LatchEntry
		LatchStats steer.LatchStats
	}
	var buf bytes.Buffer
	buf.Write(make([]byte, stateHeader))
	require.NoError(t, gob.NewEncoder(&buf).Encode(&oldPersisted{Model: cfg8, Vectors: []oldNamedDigest{{Name: "a", Digest: steer.Digest{1}}}}))
	b := buf.Bytes()
	copy(b, stateMagic)
	binary.LittleEndian.PutUint32(b[16:], stateVersion)
	binary.LittleEndian.PutUint64(b[24:], uint64(len(b)-stateHeader))
	sum := sha256.Sum256(b[stateHeader:])
	copy(b[32:], sum[:])
	got, err := decodeState(b)
	require.NoError(t, err)
	require.Equal(t, []namedDigest{{Name: "a", Digest: steer.Digest{1}}}, got.Vectors)
	require.Nil(t, got.GateConversations)

	now := &persisted{Model: cfg8, Vectors: []namedDigest{{Name: "a", Digest: steer.Digest{1}, ModelHint: "llama"}},
		GateConversations: [][]byte{[]byte("SGCV...")}}
	b, err = encodeState(now)
	require.NoError(t, err)
	got, err = decodeState(b)
	require.NoError(t, err)
	require.Equal(t, now, got)
}
