//go:build linux

package steer

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
)

// A zero Span.Phase names the phases to use.
func TestSpanPhaseMessage(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	st := e.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	defer st.End()
	h := make([]float32, 2*smallCfg.Hidden)
	for name, p := range map[string]Phase{"zero": 0, "PhaseBase": PhaseBase, "seven": 7} {
		err := st.Apply(0, 0, h, []Span{{ID: "r", Start: 0, End: 1, Phase: p}})
		require.ErrorIs(t, err, ErrBadBatch, name)
		require.Contains(t, err.Error(), "PhasePrefill", name)
		require.Contains(t, err.Error(), "PhaseDecode", name)
	}
	err := st.Apply(0, 0, h, []Span{{ID: "r", Start: 1, End: 5, Phase: PhaseDecode}})
	require.ErrorIs(t, err, ErrBadBatch)
	require.Contains(t, err.Error(), "rows [1, 5)")
}

// A span whose request id has no admitted entry is counted, and an error with StrictRequests;
// an admitted request without request steering is neither.
func TestUnknownRequestCountedOrRefused(t *testing.T) {
	d := smallCfg.Hidden
	over := Steering{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Scale: 1, Data: filled(d, 1)}}}}
	cases := map[string]struct {
		strict   bool
		id       string
		wantUnk  uint64
		wantErr  error
		wantRows float32
	}{
		"steered":               {false, "steered", 0, nil, 1},
		"admitted, no steering": {false, "plain", 0, nil, 0},
		"mistyped":              {false, "steered ", 1, nil, 0},
		"ended":                 {false, "ended", 1, nil, 0},
		"strict: steered":       {true, "steered", 0, nil, 1},
		"strict: plain":         {true, "plain", 0, nil, 0},
		"strict: mistyped":      {true, "stered", 1, ErrUnknownRequest, 0},
		"strict: ended":         {true, "ended", 1, ErrUnknownRequest, 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newOwner(t, smallCfg, Options{})
			_, err := e.Admit(Admission{RequestID: "steered", Override: &over})
			require.NoError(t, err)
			_, err = e.Admit(Admission{RequestID: "plain"})
			require.NoError(t, err)
			_, err = e.Admit(Admission{RequestID: "ended", Override: &over})
			require.NoError(t, err)
			_, err = e.End("ended")
			require.NoError(t, err)
			w := newReader(t, e, Options{StrictRequests: tc.strict})
			st := w.NewStepper()
			defer st.Close()
			require.NoError(t, st.Begin(0))
			defer st.End()
			h := make([]float32, d)
			err = st.Apply(0, 0, h, []Span{{ID: tc.id, Start: 0, End: 1, Phase: PhaseDecode}})
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.Contains(t, err.Error(), "Owner.Admit")
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.wantUnk, st.Stats().UnknownRequests)
			require.Equal(t, tc.wantRows, h[0])
		})
	}
	e := newOwner(t, smallCfg, Options{})
	_, err := e.Admit(Admission{RequestID: "steered", Override: &over})
	require.NoError(t, err)
	_, err = e.Admit(Admission{RequestID: "plain"})
	require.NoError(t, err)
	status, err := e.Status()
	require.NoError(t, err)
	require.Equal(t, 2, status.AdmittedRequests)
	require.Equal(t, 1, status.RequestsWithSteering)
}

// ipc reports an op nobody serves with proto's sentinel, which steer recognises (no text).
func TestUnknownOpIsProtos(t *testing.T) {
	require.ErrorIs(t, ipc.ErrUnknownOp, proto.ErrUnknownOp)
}

// A worker's Register when the owner never called Owner.Serve says to call it.
func TestRegisterWithoutServeNamesServe(t *testing.T) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	secret := ipc.NewSecret([]byte("test-secret-" + hex.EncodeToString(b)))
	ns := "steer-test-" + hex.EncodeToString(b[:6])
	rc, err := RegionConfig(smallCfg, shm.Config{IndexSlots: 1024, ArenaBytes: 1 << 20, ReaderSlots: 16})
	require.NoError(t, err)
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: ns, Region: rc,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer owner.Close()
	_, err = Open(owner.Region(), &smallCfg, Options{Logf: t.Logf}) // no Serve
	require.NoError(t, err)
	client, err := ipc.Attach(ipc.ClientOptions{Secret: &secret, Namespace: ns})
	require.NoError(t, err)
	defer client.Close()
	w, err := Attach(client.Region(), &smallCfg, Options{Caller: client})
	require.NoError(t, err)
	_, err = w.Register("v", []Vector{{Hook: "pre_attn", Scale: 1, Data: filled(smallCfg.Hidden, 1)}})
	require.ErrorIs(t, err, ErrNotServed)
	require.ErrorIs(t, err, ipc.ErrUnknownOp)
	require.Contains(t, err.Error(), "Owner.Serve")
	_, err = w.Unregister("v")
	require.ErrorIs(t, err, ErrNotServed)
}
