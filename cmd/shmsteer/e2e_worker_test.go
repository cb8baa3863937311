package main

// Workers against a live serve: the README's quick start, and a worker following serve's restart.

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/serve"
	"github.com/shmsteer/shmsteer/steer"
	"github.com/stretchr/testify/require"
)

// TestWorkerFollowsServeRestart: a worker (this process) reads a named vector through an
// ipc.Follower from several goroutines while serve is stopped with SIGTERM and started again
// on its state dir; the worker keeps reading the dead region (flagged), re-attaches by itself,
// and every read, before, during and after, is the whole registered vector.
func TestWorkerFollowsServeRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	name := ns(t)
	s := startServe(t, name, dir)
	want := [][]float32{vec(100), vec(101)}
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"name": "v", "kind": "steer", "packed": map[string]any{"pre_attn": packed("float32", []int{0, 3}, want)}})
	sec := ipc.NewSecret([]byte(e2eSecret))
	f, err := ipc.Follow(ipc.FollowOptions{Client: ipc.ClientOptions{Secret: &sec, Namespace: name}, Poll: 10 * time.Millisecond,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Retire: time.Second, Ready: serve.IsReady})
	require.NoError(t, err)
	defer f.Close()
	firstRegion := f.Client().Region().ID()

	var (
		mu      sync.Mutex
		engines = map[*ipc.Client]*steer.Worker{}
		stop    atomic.Bool
		readErr atomic.Pointer[string]
		reads   [3]atomic.Uint64 // by generation
		dead    atomic.Uint64
	)
	engineOf := func(c *ipc.Client) (*steer.Worker, error) {
		mu.Lock()
		defer mu.Unlock()
		if e := engines[c]; e != nil {
			return e, nil
		}
		e, err := steer.Attach(c.Region(), nil, steer.Options{Caller: c})
		engines[c] = e
		return e, err
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail := func(err error) { msg := err.Error(); readErr.Store(&msg) }
			for !stop.Load() {
				gen, isDead := f.Generation(), f.Dead()
				c := f.Client()
				eng, err := engineOf(c)
				if err != nil {
					fail(err)
					return
				}
				snap, err := c.Region().Snapshot()
				if err != nil {
					fail(err)
					return
				}
				nv, err := eng.Vector(&snap, "v")
				if err == nil && (len(nv.Vectors) != 2 || !slices.Equal(nv.Vectors[0].Data, want[0]) || !slices.Equal(nv.Vectors[1].Data, want[1])) {
					err = fmt.Errorf("torn or wrong vector read: %d entries", len(nv.Vectors))
				}
				snap.Close()
				if err != nil {
					fail(err)
					return
				}
				if gen < 3 {
					reads[gen].Add(1)
				}
				if isDead {
					dead.Add(1)
				}
				time.Sleep(50 * time.Microsecond)
			}
		}()
	}
	require.Eventually(t, func() bool { return reads[1].Load() > 50 }, 10*time.Second, time.Millisecond)
	require.NoError(t, s.stop(syscall.SIGTERM))
	require.Eventually(t, f.Dead, 10*time.Second, time.Millisecond)
	require.ErrorIs(t, f.Err(), ipc.ErrDeadRegion)
	require.Eventually(t, func() bool { return dead.Load() > 20 }, 10*time.Second, time.Millisecond)
	startServe(t, name, dir)
	require.Eventually(t, func() bool { return f.Generation() == 2 && !f.Dead() }, 10*time.Second, time.Millisecond)
	require.NotEqual(t, firstRegion, f.Client().Region().ID())
	require.Eventually(t, func() bool { return reads[2].Load() > 50 || readErr.Load() != nil }, 10*time.Second, time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if e := readErr.Load(); e != nil {
		t.Fatal(*e)
	}
	t.Logf("reads: %d before, %d from the dead region, %d after the restart", reads[1].Load(), dead.Load(), reads[2].Load())
}

// TestWorkerStepsWithAPISteering is the README's quick start: serve runs, a worker attaches,
// and steering changed through the control API changes what the worker's next step adds.
func TestWorkerStepsWithAPISteering(t *testing.T) {
	s := startServe(t, ns(t), "")
	g, r := vec(200), vec(201)
	s.ok("POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"post_block": map[string]any{"1": g}}})
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "steer", "name": "polite", "packed": map[string]any{"post_block": packed("float32", []int{1}, [][]float32{r})}})
	s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "r1", "override": map[string]any{"decode_vector_refs": map[string]float32{"polite": 0.5}}})

	sec := ipc.NewSecret([]byte(e2eSecret))
	f, err := ipc.Follow(ipc.FollowOptions{Client: ipc.ClientOptions{Secret: &sec, Namespace: s.ns}, Ready: serve.IsReady})
	require.NoError(t, err)
	defer f.Close()
	eng, err := steer.Attach(f.Client().Region(), nil, steer.Options{Caller: f.Client()})
	require.NoError(t, err)
	st := eng.NewStepper()
	defer st.Close()
	hook, err := eng.Config().Hook("post_block")
	require.NoError(t, err)
	step := func(n uint64) []float32 {
		h := make([]float32, 2*e2eHidden)
		require.NoError(t, st.Begin(0))
		require.NoError(t, st.Apply(hook, 1, h, []steer.Span{{ID: "r1", Start: 0, End: 2, Phase: steer.PhaseDecode}}))
		require.NoError(t, serve.ReportChecksum(f.Client(), "rank0", n, st.End()))
		return h
	}
	h := step(1)
	for i := range e2eHidden {
		want := g[i] + 0.5*r[i]
		require.InDelta(t, want, h[i], 1e-5)
		require.InDelta(t, want, h[e2eHidden+i], 1e-5)
	}
	// Steering changed through the API: the next step adds the new global vector.
	g2 := vec(202)
	s.ok("POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"post_block": map[string]any{"1": map[string]any{"vector": g2, "scale": 2}}}})
	h = step(2)
	for i := range e2eHidden {
		require.InDelta(t, 2*g2[i]+0.5*r[i], h[i], 1e-5)
	}
	s.ok("POST", "/v1/steering/clear", nil)
	h = step(3)
	for i := range e2eHidden {
		require.InDelta(t, 0.5*r[i], h[i], 1e-5)
	}
	w := s.ok("GET", "/v1/steering/dynamic", nil)["workers"].([]any)
	require.Len(t, w, 1)
	require.EqualValues(t, 3, w[0].(map[string]any)["step"])
}
