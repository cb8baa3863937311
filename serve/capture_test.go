package serve

import (
	"testing"

	"github.com/stretchr/testify/require"

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
