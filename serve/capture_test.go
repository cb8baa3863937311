package serve

import (
	"context"
	"encoding/binary"
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

// captureOf reads the capture the owner stored for request id, through a worker's attachment.
func (f *forkServer) captureOf(t *testing.T, id string) steer.RequestCapture {
	t.Helper()
	cs, err := AttachClient(f.ns, f.secret)
	require.NoError(t, err)
	defer cs.Close()
	s, err := cs.Engine.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	rc, err := cs.Engine.Capture(&s, id)
	require.NoError(t, err)
	for i := range rc.Consumers {
		rc.Consumers[i].Spec = append([]byte(nil), rc.Consumers[i].Spec...) // aliases the snapshot
	}
	return rc
}

// POST /v1/requests/admit takes "capture" and "prompt_len"; the owner validates each spec
// against the consumers --capture-consumer declares; every refusal is a typed 400 that admits
// nothing.
func TestAdmitCapture(t *testing.T) {
	f := startForkServer(t, "capture", nil, func(c *Config) { c.CaptureConsumers = []string{"fs=filesystem"} })
	fsSpec := func(hooks any, positions any) map[string]any {
		return map[string]any{"fs": map[string]any{"request_id": "r", "tag": "t", "hooks": hooks, "positions": positions}}
	}
	f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "r", "prompt_len": 5, "capture": fsSpec(map[string]any{hp: []int{1, 0}}, "all")})
	rc := f.captureOf(t, "r")
	require.Equal(t, 5, rc.PromptLen)
	require.Len(t, rc.Consumers, 1)
	require.Equal(t, "fs", rc.Consumers[0].Name)
	require.Len(t, rc.Consumers[0].Sites, 2)
	require.Equal(t, steer.CaptureAll, rc.Consumers[0].Positions.Kind)

	for _, tc := range []struct {
		name string
		body map[string]any
		typ  string
	}{
		{"undeclared consumer", map[string]any{"prompt_len": 5, "capture": map[string]any{"other": map[string]any{}}}, "capture_consumer"},
		{"bad consumer name", map[string]any{"prompt_len": 5, "capture": map[string]any{"a b": map[string]any{}}}, "capture_consumer"},
		{"not an object", map[string]any{"prompt_len": 5, "capture": []int{1}}, "capture_spec"},
		{"layer out of range", map[string]any{"prompt_len": 5, "capture": fsSpec(map[string]any{hp: []int{forkLayers}}, "all")}, "layer_range"},
		{"unknown hook", map[string]any{"prompt_len": 5, "capture": fsSpec(map[string]any{"nope": "all"}, "all")}, "unknown_hook"},
		{"position past the prompt", map[string]any{"prompt_len": 5, "capture": fsSpec(map[string]any{hp: "all"}, []int{5})}, "capture_spec"},
		{"no prompt_len", map[string]any{"capture": fsSpec(map[string]any{hp: "all"}, "last_prompt")}, "capture_spec"},
		{"negative prompt_len", map[string]any{"prompt_len": -1}, "bad_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.body["request_id"] = "refused"
			code, m := f.post(t, "/v1/requests/admit", tc.body)
			require.Equal(t, 400, code, "%v", m)
			require.Equal(t, tc.typ, m["type"], "%v", m)
			require.Empty(t, f.captureOf(t, "refused").Consumers)
		})
	}
	// An oversized spec is refused as too large, not as an undeclared consumer.
	code, m := f.post(t, "/v1/requests/admit", map[string]any{"request_id": "refused", "prompt_len": 5,
		"capture": map[string]any{"fs": map[string]any{"request_id": strings.Repeat("x", steer.MaxCaptureSpec)}}})
	require.Equal(t, 400, code, "%v", m)
	require.Equal(t, "capture_spec", m["type"], "%v", m)
	require.Contains(t, m["error"], "too large")
	require.NotContains(t, m["error"], "not declared")
	// Re-admitted without capture: the stored capture is gone.
	f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "r"})
	require.Empty(t, f.captureOf(t, "r").Consumers)
}

func TestConfigCaptureConsumers(t *testing.T) {
	c := DefaultConfig()
	c.CaptureConsumers = []string{"fs=filesystem", "b=filesystem"}
	d, err := c.CaptureDeclarations()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"fs": "filesystem", "b": "filesystem"}, d)
	for _, bad := range [][]string{{"fs=sqlite"}, {"fs"}, {"fs=filesystem", "fs=filesystem"}, {"a/b=filesystem"}} {
		c.CaptureConsumers = bad
		require.ErrorIs(t, c.Validate(), ErrConfig, "%v", bad)
	}
}

// --capture-global NAME=@FILE: every request that names no capture is captured with the
// consumer's global spec, under its own id; a request naming the consumer replaces it; the
// results say "global": true, and a request the global spec cannot apply to is admitted with
// that consumer's result error.
func TestCaptureGlobalSpec(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "g.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"tag": "every", "hooks": {"post_block": [0]}, "positions": "all", "layout": "packed"}`), 0o600))
	f := startForkServer(t, "capglobal", nil, func(c *Config) {
		c.CaptureConsumers = []string{"g=filesystem"}
		c.CaptureGlobal = []string{"g=@" + file}
	})
	result := func(id string) map[string]any {
		code, m := f.get(t, "/v1/requests/"+id+"/capture")
		require.Equal(t, http.StatusOK, code, "%v", m)
		return m["g"].(map[string]any)
	}
	attach := func() *ipc.Client {
		cl, err := ipc.Attach(ipc.ClientOptions{Namespace: f.ns, SecretFile: f.secret})
		require.NoError(t, err)
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	w, err := capture.RegisterWorker(attach(), capture.WorkerOptions{Capacity: 1 << 20})
	require.NoError(t, err)
	defer w.Close()
	cons, err := capture.NewConsumer(attach(), capture.ConsumerOptions{Name: "g"})
	require.NoError(t, err)
	root := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- capture.RunFilesystem(ctx, cons, capture.FSConsumerOptions{Root: root, FS: capture.FSOptions{NoFsync: true},
			Config: steer.ModelConfig{Hidden: forkHidden, Layers: forkLayers, Hooks: steer.DefaultHooks}}, nil)
	}()
	defer func() { cancel(); <-done; cons.Close() }() // the consumer is one goroutine's at a time

	f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "plain", "prompt_len": 2})
	rc := f.captureOf(t, "plain")
	require.Len(t, rc.Consumers, 1)
	require.Equal(t, "g", rc.Consumers[0].Name)
	r := result("plain")
	require.Equal(t, "pending", r["status"], "%v", r)
	require.Equal(t, true, r["global"], "%v", r)
	data := make([]byte, 0, 2*forkHidden*4)
	for i := range 2 * forkHidden {
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(i)))
	}
	require.NoError(t, w.Writer().Append("plain", capture.Record{Layer: 0, Hook: hp, Dtype: capture.Float32, Rows: 2, Width: forkHidden, Positions: []int{0, 1}, Data: data}))
	f.ok(t, "/v1/requests/end", map[string]any{"request_id": "plain"})
	for deadline := time.Now().Add(10 * time.Second); result("plain")["status"] == "pending" && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	r = result("plain")
	require.Equal(t, "ok", r["status"], "%v", r)
	require.Equal(t, true, r["global"], "%v", r)
	bin, err := os.ReadFile(filepath.Join(root, "every", "plain", "packed.bin"))
	require.NoError(t, err)
	require.Equal(t, data, bin)

	// A request's own spec replaces the global one: no "global" in its result.
	own := map[string]any{"g": map[string]any{"request_id": "x", "tag": "mine", "hooks": map[string]any{hp: []int{1}}, "positions": "last_prompt"}}
	f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "own", "prompt_len": 2, "capture": own})
	require.Equal(t, 1, len(f.captureOf(t, "own").Consumers[0].Sites))
	_, has := result("own")["global"]
	require.False(t, has)

	// No prompt_len: admitted, the global spec's result is error and says why.
	f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "noprompt"})
	require.Empty(t, f.captureOf(t, "noprompt").Consumers)
	r = result("noprompt")
	require.Equal(t, "error", r["status"], "%v", r)
	require.Equal(t, true, r["global"], "%v", r)
	require.Contains(t, r["error"], "global spec does not apply")
}

func TestConfigCaptureGlobal(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(`{"tag": "t", "hooks": {"post_block": "all"}, "positions": "last_prompt"}`), 0o600))
	withID := filepath.Join(dir, "id.json")
	require.NoError(t, os.WriteFile(withID, []byte(`{"request_id": "r", "tag": "t", "hooks": {"post_block": "all"}, "positions": "all"}`), 0o600))
	c := DefaultConfig()
	c.CaptureConsumers = []string{"g=filesystem"}
	c.CaptureGlobal = []string{"g=@" + good}
	g, err := c.CaptureGlobalSpecs()
	require.NoError(t, err)
	require.Len(t, g, 1)
	for _, bad := range [][]string{{"g=" + good}, {"g=@"}, {"other=@" + good}, {"g=@" + good, "g=@" + good}, {"g=@" + filepath.Join(dir, "missing.json")}, {"g=@" + withID}} {
		c.CaptureGlobal = bad
		require.ErrorIs(t, c.Validate(), ErrConfig, "%v", bad)
	}
}

// A tenant's stored capture specs (its admitted requests not yet ended) count against
// tenant_max_capture_bytes: beyond it an admission is 429 "quota" and admits nothing; ending a
// request frees its share; another tenant and the admin keys are not held back.
func TestCaptureQuota(t *testing.T) {
	const admin, acme, beta = "admin-0123456789abcdef", "acme-0123456789abcdef", "beta-0123456789abcdef"
	f := startForkServer(t, "capture-quota", []string{admin, "acme:" + acme, "beta:" + beta}, func(c *Config) {
		c.Auth = AuthKeys
		c.CaptureConsumers = []string{"fs=filesystem"}
		c.TenantMaxCaptureBytes = 1500
	})
	admit := func(key, id string) (int, map[string]any) {
		spec := map[string]any{"request_id": strings.Repeat("r", 250), "tag": strings.Repeat("t", 250), "hooks": map[string]any{hp: "all"}, "positions": "all"}
		return f.post(t, "/v1/requests/admit", map[string]any{"request_id": id, "prompt_len": 4, "capture": map[string]any{"fs": spec}}, "Authorization: Bearer "+key)
	}
	for _, id := range []string{"acme/1", "acme/2"} {
		code, m := admit(acme, id)
		require.Equal(t, 200, code, "%v", m)
	}
	code, m := admit(acme, "acme/3")
	require.Equal(t, 429, code, "%v", m)
	require.Equal(t, "quota", m["type"], "%v", m)
	require.Contains(t, m["error"], "tenant_max_capture_bytes")
	require.Empty(t, f.captureOf(t, "acme/3").Consumers)
	code, m = f.call(t, "GET", "/v1/status", nil, "Authorization: Bearer "+acme)
	require.Equal(t, 200, code, "%v", m)
	require.Greater(t, m["capture_bytes"], float64(1000))
	require.Equal(t, float64(1500), m["tenant_max_capture_bytes"])
	// Another tenant, and the admin keys, are not held back.
	code, m = admit(beta, "beta/1")
	require.Equal(t, 200, code, "%v", m)
	code, m = admit(admin, "admin-1")
	require.Equal(t, 200, code, "%v", m)
	// Ending a request frees its share.
	code, m = f.post(t, "/v1/requests/end", map[string]any{"request_id": "acme/1"}, "Authorization: Bearer "+acme)
	require.Equal(t, 200, code, "%v", m)
	code, m = admit(acme, "acme/3")
	require.Equal(t, 200, code, "%v", m)
}
