package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	adminKey  = "admin-0123456789abcdef"
	tenantKey = "tenant-a-0123456789abcdef"
)

// testServer runs serve in this process with an admin key and a key of tenant "a", hidden 8,
// 4 layers and a state dir; edit adjusts the config first.
type testServer struct {
	t    *testing.T
	addr string
	cfg  Config
	stop func() error
}

func startTestServer(t *testing.T, name string, edit func(*Config)) *testServer {
	dir := t.TempDir()
	keyFile, secretFile := filepath.Join(dir, "keys"), filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(keyFile, []byte(adminKey+"\na:"+tenantKey+"\n"), 0o600))
	require.NoError(t, os.WriteFile(secretFile, []byte("harden-test-secret"), 0o600))
	cfg := DefaultConfig()
	cfg.Namespace = fmt.Sprintf("%s-%d", name, os.Getpid())
	cfg.Hidden, cfg.Layers, cfg.ArenaBytes, cfg.IndexSlots = 8, 4, 16<<20, 1024
	cfg.HTTP, cfg.APIKeyFile, cfg.SecretFile, cfg.StateDir = "127.0.0.1:0", keyFile, secretFile, filepath.Join(dir, "state")
	cfg.PersistInterval = 5 * time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	addr, stop := runInProcess(t, cfg)
	ts := &testServer{t: t, addr: addr, cfg: cfg, stop: stop}
	t.Cleanup(func() {
		if ts.stop != nil {
			ts.stop()
		}
	})
	return ts
}

func (ts *testServer) close() error {
	stop := ts.stop
	ts.stop = nil
	return stop()
}

// do sends a JSON call with key and returns the status and the decoded reply.
func (ts *testServer) do(key, method, path, body string) (int, map[string]any) {
	req, err := http.NewRequest(method, ts.addr+path, strings.NewReader(body))
	require.NoError(ts.t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(ts.t, err)
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func (ts *testServer) register(key, name string) {
	row := "[1,0,0,0,0,0,0,1]"
	code, m := ts.do(key, "POST", "/v1/steering/vectors/register", fmt.Sprintf(`{"name":%q,"kind":"steer","packed":{"pre_attn":%s}}`, name, packedJSON(ts.t, row)))
	require.Equal(ts.t, 200, code, "%v", m)
}

// Unregistering a named vector the global steering references drops the references in the
// same write and says so (dropped_references: ["global"]); later merging sets keep working.
// Before, the unregister answered 200 and every later merging /v1/steering/set failed with
// "unknown named vector" until a replace or clear.
func TestUnregisterReferencedByGlobal(t *testing.T) {
	ts := startTestServer(t, "unreg-global", nil)
	ts.register(adminKey, "a")
	ts.register(adminKey, "b")
	code, m := ts.do(adminKey, "POST", "/v1/steering/set", `{"vector_refs":{"a":1,"b":2}}`)
	require.Equal(t, 200, code, "%v", m)
	code, m = ts.do(adminKey, "POST", "/v1/steering/vectors/unregister", `{"name":"a","kind":"steer"}`)
	require.Equal(t, 200, code, "%v", m)
	require.Equal(t, []any{"global"}, m["dropped_references"])
	code, m = ts.do(adminKey, "POST", "/v1/steering/set", `{"vectors":{"pre_attn":{"1":[1,1,1,1,1,1,1,1]}}}`)
	require.Equal(t, 200, code, "a merging set after the unregister: %v", m)
	code, m = ts.do(adminKey, "POST", "/v1/steering/vectors/unregister", `{"name":"b","kind":"steer"}`)
	require.Equal(t, 200, code, "%v", m)
	require.Equal(t, []any{"global"}, m["dropped_references"])
	ts.register(adminKey, "c")
	code, m = ts.do(adminKey, "POST", "/v1/steering/vectors/unregister", `{"name":"c","kind":"steer"}`)
	require.Equal(t, 200, code, "%v", m)
	require.Equal(t, []any{}, m["dropped_references"], "nothing referenced c")
	code, m = ts.do(adminKey, "POST", "/v1/steering/set", `{"vector_refs":{"a":1}}`)
	require.Equal(t, 400, code, "a was unregistered: %v", m)
	require.NoError(t, ts.close())
}
