package steer

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
)

// mergeCfg has 100 (hook, layer) sites: one per merge of TestGlobalMergesAcrossProcesses.
var mergeCfg = ModelConfig{Hidden: 8, Layers: 20}

// mergeSite is the i-th site of mergeCfg.
func mergeSite(i int) Vector {
	return Vector{Hook: DefaultHooks[i%len(DefaultHooks)], Layer: i / len(DefaultHooks), Scale: 1, Data: filled(mergeCfg.Hidden, float32(i+1))}
}

// mergeRun is the "merge" child: it attaches to the owner named by the environment and merges
// sites [first, first+n) into the global steering, one RPC each.
func mergeRun() childResult {
	var r childResult
	secret := ipc.NewSecret([]byte(os.Getenv("STEER_TEST_SECRET")))
	c, err := ipc.Attach(ipc.ClientOptions{Secret: &secret, Namespace: os.Getenv("STEER_TEST_NS")})
	if err != nil {
		r.ErrorMsg = err.Error()
		return r
	}
	defer c.Close()
	e, err := Attach(c.Region(), &mergeCfg, Options{Caller: c})
	if err != nil {
		r.ErrorMsg = err.Error()
		return r
	}
	first, _ := strconv.Atoi(os.Getenv("STEER_TEST_FIRST"))
	n, _ := strconv.Atoi(os.Getenv("STEER_TEST_N"))
	for i := first; i < first+n; i++ {
		time.Sleep(time.Duration(mrand.IntN(300)) * time.Microsecond) // interleave with the owner
		if _, err := e.SetGlobal(Steering{Base: Tier{Vectors: []Vector{mergeSite(i)}}}, Merge()); err != nil {
			r.ErrorMsg = err.Error()
			return r
		}
	}
	return r
}

// TestGlobalMergesAcrossProcesses merges 100 distinct sites into the global steering at once:
// 50 from a worker process over RPC and 50 in the owner (as serve's API does), interleaved.
// Every merge is one owner-side operation under its write lock, so none is lost; when a
// worker's merge was a read of the region followed by a replacing write, most were (89 of 100
// in the measurement).
func TestGlobalMergesAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	secretText := "merge-secret-" + hex.EncodeToString(b)
	secret := ipc.NewSecret([]byte(secretText))
	ns := "steer-merge-" + hex.EncodeToString(b[:6])
	rc, err := RegionConfig(mergeCfg, shm.Config{IndexSlots: 1 << 10, ArenaBytes: 16 << 20, ReaderSlots: 16})
	require.NoError(t, err)
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: ns, Region: rc,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer owner.Close()
	e, err := Open(owner.Region(), &mergeCfg, Options{Logf: t.Logf})
	require.NoError(t, err)
	e.Serve(func(op uint16, h func([]byte) ([]byte, error)) { owner.Handle(op, h) })

	const n = 50
	v0 := e.Region().Version()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Start once the worker's merges have begun, so that the two streams overlap.
		for deadline := time.Now().Add(10 * time.Second); e.Region().Version() == v0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Microsecond)
		}
		for i := range n {
			time.Sleep(time.Duration(mrand.IntN(300)) * time.Microsecond)
			_, err := e.SetGlobal(Steering{Base: Tier{Vectors: []Vector{mergeSite(n + i)}}}, Merge())
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	runChild(t, "merge", []string{"STEER_TEST_SECRET=" + secretText, "STEER_TEST_NS=" + ns,
		"STEER_TEST_FIRST=0", "STEER_TEST_N=" + strconv.Itoa(n)})
	wg.Wait()

	s, err := e.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	g, _, ok, err := e.Global(&s)
	require.NoError(t, err)
	require.True(t, ok)
	have := map[string]bool{}
	for _, v := range g.Base.Vectors {
		have[fmt.Sprintf("%s/%d", v.Hook, v.Layer)] = true
		require.Equal(t, mergeSite(v.Layer*len(DefaultHooks)+hookIndex(v.Hook)).Data, v.Data)
	}
	lost := 0
	for i := range 2 * n {
		v := mergeSite(i)
		if !have[fmt.Sprintf("%s/%d", v.Hook, v.Layer)] {
			lost++
		}
	}
	t.Logf("lost merges: %d of %d", lost, 2*n)
	require.Zero(t, lost, "lost merges")
	require.Len(t, g.Base.Vectors, 2*n)
}

func hookIndex(h string) int {
	for i, x := range DefaultHooks {
		if x == h {
			return i
		}
	}
	return -1
}
