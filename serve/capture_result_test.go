package serve

import (
	"context"
	"encoding/binary"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
)

// The capture results end to end through serve: a worker's ring and a filesystem consumer
// attached to serve's hub, a request admitted with capture, its rows appended, its end; GET
// /v1/requests/{id}/capture goes pending → ok with the paths the consumer wrote, /status and
// /metrics count the records; a consumer gone turns a later request's result to error.
func TestCaptureResults(t *testing.T) {
	f := startForkServer(t, "capres", nil, func(c *Config) { c.CaptureConsumers = []string{"fs=filesystem"} })
	result := func(id string) map[string]any {
		code, m := f.get(t, "/v1/requests/"+id+"/capture")
		require.Equal(t, http.StatusOK, code, "%v", m)
		return m["fs"].(map[string]any)
	}
	require.Equal(t, "not_requested", result("r0")["status"])

	attach := func() *ipc.Client {
		cl, err := ipc.Attach(ipc.ClientOptions{Namespace: f.ns, SecretFile: f.secret})
		require.NoError(t, err)
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	w, err := capture.RegisterWorker(attach(), capture.WorkerOptions{Capacity: 1 << 20})
	require.NoError(t, err)
	cons, err := capture.NewConsumer(attach(), capture.ConsumerOptions{Name: "fs"})
	require.NoError(t, err)
	root := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- capture.RunFilesystem(ctx, cons, capture.FSConsumerOptions{Root: root, FS: capture.FSOptions{NoFsync: true},
			Config: steer.ModelConfig{Hidden: forkHidden, Layers: forkLayers, Hooks: steer.DefaultHooks}}, nil)
	}()

	spec := map[string]any{"fs": map[string]any{"request_id": "r1", "tag": "t", "hooks": map[string]any{hp: []int{0}}, "positions": "all", "layout": "packed"}}
	f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "r1", "prompt_len": 2, "capture": spec})
	require.Equal(t, "pending", result("r1")["status"])
	data := make([]byte, 0, 2*forkHidden*4)
	for i := range 2 * forkHidden {
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(i)))
	}
	require.NoError(t, w.Writer().Append("r1", capture.Record{Layer: 0, Hook: hp, Dtype: capture.Float32, Rows: 2, Width: forkHidden, Positions: []int{0, 1}, Data: data}))
	f.ok(t, "/v1/requests/end", map[string]any{"request_id": "r1"})
	var got map[string]any
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if got = result("r1"); got["status"] != "pending" || time.Now().After(deadline) {
			break
		}
	}
	require.Equal(t, "ok", got["status"], "%v", got)
	require.Nil(t, got["error"])
	paths := got["payload"].([]any)
	require.Len(t, paths, 2)
	bin, err := os.ReadFile(filepath.Join(root, "t", "r1", "packed.bin"))
	require.NoError(t, err)
	require.Equal(t, data, bin)

	_, st := f.get(t, "/v1/status")
	capSt := st["capture"].(map[string]any)
	ring := capSt["rings"].([]any)[0].(map[string]any)
	require.EqualValues(t, 1, ring["records"])
	resp, err := http.Get(f.addr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"shmsteer_capture_records_total 1\n", `shmsteer_capture_consumer_attached{consumer="fs"} 1`,
		`shmsteer_capture_consumer_records_total{consumer="fs"} 1`, "shmsteer_capture_dropped_total 0\n", "shmsteer_capture_rings 1\n"} {
		require.Contains(t, string(metrics), want)
	}

	// The worker leaves: the totals keep its ring's counts.
	w.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, st = f.get(t, "/v1/status")
		if len(st["capture"].(map[string]any)["rings"].([]any)) == 0 || time.Now().After(deadline) {
			break
		}
	}
	capSt = st["capture"].(map[string]any)
	require.Empty(t, capSt["rings"])
	require.EqualValues(t, 1, capSt["totals"].(map[string]any)["records"])
	require.EqualValues(t, 1, capSt["consumers"].([]any)[0].(map[string]any)["records_received"])

	// The consumer leaves: a request captured while it was open ends with status error.
	f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "r2", "prompt_len": 2, "capture": spec})
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	cons.Close()
	for deadline := time.Now().Add(10 * time.Second); result("r2")["status"] == "pending" && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	r2 := result("r2")
	require.Equal(t, "error", r2["status"])
	require.True(t, strings.Contains(r2["error"].(string), "left before publishing"), "%v", r2)
}
