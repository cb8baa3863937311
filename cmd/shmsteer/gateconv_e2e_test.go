package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
)

// rest_of_conversation across processes: the probe "p" reads dimension 0 at (post_block, 1)
// (threshold 0.5, sharpness 100: h[0] = 0.9 fires, 0.1 does not) and the gate's add "s" writes
// dimension 1 at (post_block, 2).

func unitVec(i int) []float32 {
	v := make([]float32, e2eHidden)
	v[i] = 1
	return v
}

// registerConvGateVectors registers the probe and the add through s's API.
func registerConvGateVectors(s *served) {
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "probe", "name": "p",
		"packed": map[string]any{"post_block": packed("float32", []int{1}, [][]float32{unitVec(0)})}})
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "steer", "name": "s",
		"packed": map[string]any{"post_block": packed("float32", []int{2}, [][]float32{unitVec(1)})}})
}

// admitConv admits request id of conversation conv on s, with the rest_of_conversation gate
// when gated.
func admitConv(s *served, id, conv string, gated bool) {
	body := map[string]any{"request_id": id, "conversation": conv}
	if gated {
		body["steering"] = []any{map[string]any{
			"when":  map[string]any{"kind": "probe", "probe": map[string]any{"kind": "name", "name": "p"}, "threshold": 0.5, "sharpness": 100},
			"scope": "rest_of_conversation",
			"apply": map[string]any{"kind": "add", "steer": map[string]any{"kind": "name", "name": "s"}, "strength": 2},
		}}
	}
	s.ok("POST", "/v1/requests/admit", body)
}

// convWorker is a worker attached to a serve: a fresh engine and Stepper (it remembers no
// engaged gate of its own).
type convWorker struct {
	t   *testing.T
	c   *ipc.Client
	eng *steer.Worker
	st  *steer.Stepper
}

func attachConvWorker(t *testing.T, s *served) *convWorker {
	sec := ipc.NewSecret([]byte(e2eSecret))
	c, err := ipc.Attach(ipc.ClientOptions{Secret: &sec, Namespace: s.ns})
	require.NoError(t, err)
	eng, err := steer.Attach(c.Region(), nil, steer.Options{Caller: c})
	require.NoError(t, err)
	w := &convWorker{t: t, c: c, eng: eng, st: eng.NewStepper()}
	t.Cleanup(w.close)
	return w
}

func (w *convWorker) close() {
	if w.st != nil {
		w.st.Close()
		w.c.Close()
		w.st = nil
	}
}

// step runs one decode step of request id (one row with h[0] = h0) through post_block layers
// 0..2 and returns what the gate added to dimension 1.
func (w *convWorker) step(id string, h0 float32) float32 {
	hook, err := w.eng.Config().Hook("post_block")
	require.NoError(w.t, err)
	require.NoError(w.t, w.st.Begin(0))
	var got float32
	for l := range 3 {
		h := make([]float32, e2eHidden)
		h[0] = h0
		require.NoError(w.t, w.st.Apply(hook, l, h, []steer.Span{{ID: id, Start: 0, End: 1, Phase: steer.PhaseDecode}}))
		got = h[1]
	}
	w.st.End()
	return got
}

// engage runs conversation conv's first request r on s with a fresh worker until its gate
// engaged there, and waits until s saved the state it learnt from the worker's report.
func engage(t *testing.T, s *served, conv, r string) {
	admitConv(s, r, conv, true)
	w := attachConvWorker(t, s)
	require.Zero(t, w.step(r, 0.1), "not fired yet")
	saves := waitSaved(t, s)
	require.Zero(t, w.step(r, 0.9), "fired: applies from the next step")
	require.Equal(t, float32(2), w.step(r, 0.1), "engaged for the rest of the request")
	// The worker's report (OpGateEngaged) marks the state dirty; it is saved within
	// persist_interval (nothing else changes meanwhile).
	waitFor(t, 10*time.Second, "the engaged gate saved", func() bool {
		st := s.ok("GET", "/v1/status", nil)
		return st["state_saves"].(float64) > saves && st["state_dirty"] == false
	})
	w.close()
}

// waitSaved waits until s has nothing unsaved and returns its save count.
func waitSaved(t *testing.T, s *served) float64 {
	var saves float64
	waitFor(t, 10*time.Second, "the state saved", func() bool {
		st := s.ok("GET", "/v1/status", nil)
		saves = st["state_saves"].(float64)
		return st["state_dirty"] == false
	})
	return saves
}

// TestServeGateConversationRestart: a conversation's rest_of_conversation gate engages on a
// worker of serve; serve is killed (SIGKILL, after its periodic save) and restarted from its
// state dir; the conversation's next request, on a new worker, is steered from its first decode
// step, while a conversation whose gate never engaged is not.
func TestServeGateConversationRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir)
	registerConvGateVectors(s)
	admitConv(s, "q1", "quiet", true) // never fires
	engage(t, s, "chat", "r1")
	require.ErrorContains(t, s.stop(syscall.SIGKILL), "killed") // no shutdown save: the periodic one must hold it
	s2 := startServe(t, s.ns, dir)
	admitConv(s2, "r2", "chat", false)
	admitConv(s2, "q2", "quiet", false)
	w := attachConvWorker(t, s2)
	require.Equal(t, float32(2), w.step("r2", 0.1), "the restarted owner carried the engaged gate")
	require.Zero(t, w.step("q2", 0.1), "carried, not engaged")
	require.Zero(t, w.step("q2", 0.9))
	require.Equal(t, float32(2), w.step("q2", 0.1), "it still fires in the carried request")
}

// TestServeGateConversationMirror: two serve processes mirrored through JetStream; a
// conversation's gate engages on host A's worker; the conversation's next request, admitted on
// host B, is steered from its first decode step by B's worker.
func TestServeGateConversationMirror(t *testing.T) {
	url := startNATS(t)
	bucket := fmt.Sprintf("e2e-conv-%d", os.Getpid())
	a := startServe(t, ns(t)+"-a", filepath.Join(t.TempDir(), "state-a"), "--mirror", url, "--mirror-bucket", bucket, "--host-id", "host-a")
	b := startServe(t, ns(t)+"-b", filepath.Join(t.TempDir(), "state-b"), "--mirror", url, "--mirror-bucket", bucket, "--host-id", "host-b")
	registerConvGateVectors(a)
	waitFor(t, 20*time.Second, "the vectors on host B", func() bool {
		return len(b.ok("GET", "/v1/steering/vectors?details=1", nil)["details"].([]any)) == 2
	})
	engage(t, a, "chat", "r1")
	wb := attachConvWorker(t, b)
	waitFor(t, 20*time.Second, "the engaged conversation on host B", func() bool {
		admitConv(b, "r2", "chat", false)
		return wb.step("r2", 0.1) == 2
	})
	admitConv(b, "u1", "unknown", false)
	require.Zero(t, wb.step("u1", 0.1), "another conversation carries nothing")
}
