package main

// Who may call serve: API keys, the unix socket and key reload, the secret file.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/serve"
	"github.com/stretchr/testify/require"
)

func TestServeAuth(t *testing.T) {
	s := startServe(t, ns(t), "")
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		code, _ := s.call("GET", path, "", nil)
		require.Equal(t, http.StatusOK, code, path)
	}
	for _, tc := range []struct {
		name, method, path, key string
		body                    any
		code                    int
	}{
		{"no key", "GET", "/v1/status", "", nil, 401},
		{"no key vectors", "GET", "/v1/steering/vectors", "", nil, 401},
		{"no key unknown path", "GET", "/v1/nothing", "", nil, 401},
		{"wrong key", "GET", "/v1/status", "not-a-key-0123456789abcdef", nil, 401},
		{"key prefix", "GET", "/v1/status", adminKey[:10], nil, 401},
		{"basic scheme", "GET", "/v1/status", "", nil, 401},
		{"admin", "GET", "/v1/status", adminKey, nil, 200},
		{"rotated admin", "GET", "/v1/status", adminKey2, nil, 200},
		{"tenant reads", "GET", "/v1/steering", acmeKey, nil, 200},
		{"tenant sets global", "POST", "/v1/steering/set", acmeKey, map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"0": vec(1)}}}, 403},
		{"tenant clears global", "POST", "/v1/steering/clear", acmeKey, nil, 403},
		{"tenant registers another's name", "POST", "/v1/steering/vectors/register", acmeKey,
			map[string]any{"name": "other/v", "kind": "steer", "packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(2)})}}, 403},
		{"tenant registers unscoped name", "POST", "/v1/steering/vectors/register", acmeKey,
			map[string]any{"name": "v", "kind": "steer", "packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(2)})}}, 403},
		{"tenant registers own", "POST", "/v1/steering/vectors/register", acmeKey,
			map[string]any{"name": "acme/v", "kind": "steer", "packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(2)})}}, 200},
		{"other tenant removes it", "POST", "/v1/steering/vectors/unregister", otherKey, map[string]any{"name": "acme/v", "kind": "steer"}, 403},
		{"other tenant drops its conversation", "DELETE", "/v1/conversations/acme/c1", otherKey, nil, 403},
		{"other tenant admits as acme", "POST", "/v1/requests/admit", otherKey, map[string]any{"request_id": "r", "tenant": "acme", "conversation": "c1"}, 403},
		{"other tenant refs acme's vector", "POST", "/v1/requests/admit", otherKey,
			map[string]any{"request_id": "other/r", "conversation": "c1", "override": map[string]any{"vector_refs": map[string]float32{"acme/v": 1}}}, 403},
		{"tenant admits an unscoped request id", "POST", "/v1/requests/admit", acmeKey, map[string]any{"request_id": "r", "conversation": "c1"}, 403},
		{"tenant admits its own", "POST", "/v1/requests/admit", acmeKey,
			map[string]any{"request_id": "acme/r", "conversation": "c1", "override": map[string]any{"vector_refs": map[string]float32{"acme/v": 1}}}, 200},
		{"other tenant ends it", "POST", "/v1/requests/end", otherKey, map[string]any{"request_id": "acme/r"}, 403},
		{"tenant drops its conversation", "DELETE", "/v1/conversations/acme/c1", acmeKey, nil, 200},
		{"tenant ends its request", "POST", "/v1/requests/end", acmeKey, map[string]any{"request_id": "acme/r"}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, s.addr+tc.path, nil)
			if tc.body != nil {
				b, _ := json.Marshal(tc.body)
				req, _ = http.NewRequest(tc.method, s.addr+tc.path, bytes.NewReader(b))
			}
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			} else if tc.name == "basic scheme" {
				req.SetBasicAuth("admin", adminKey)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			var m map[string]any
			json.NewDecoder(resp.Body).Decode(&m)
			resp.Body.Close()
			require.Equal(t, tc.code, resp.StatusCode, "%v", m)
			if tc.code >= 400 {
				require.NotEmpty(t, m["error"])
				require.NotEmpty(t, m["type"])
			}
		})
	}
	// Tenants see only their own vectors; the admin sees all.
	_, m := s.call("GET", "/v1/steering/vectors", otherKey, nil)
	require.EqualValues(t, 0, m["count"])
	_, m = s.call("GET", "/v1/steering/vectors", acmeKey, nil)
	require.EqualValues(t, 1, m["count"])
	require.EqualValues(t, 1, s.ok("GET", "/v1/steering/vectors", nil)["count"])
}

func TestServeUnixSocketAndKeyReload(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	keys := writeKeys(t)
	cmd := exec.Command(binPath, "serve", "--http", "unix:"+sock, "--namespace", ns(t), "--hidden", "8", "--layers", "2",
		"--arena-bytes", fmt.Sprint(16<<20), "--api-key-file", keys, "--log-format", "json")
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	var logs bytes.Buffer
	cmd.Stderr = &logs
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "listening on unix:"+sock+"\n", line)
	st, err := os.Stat(sock)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	get := func(key string) int {
		req, _ := http.NewRequest("GET", "http://unix/v1/status", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 200, get(adminKey))
	// Rotation: replace the key file and send SIGHUP.
	require.NoError(t, os.WriteFile(keys, []byte(adminKey2+"\n"), 0o600))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return get(adminKey) == 401 }, 5*time.Second, 20*time.Millisecond)
	require.Equal(t, 200, get(adminKey2))
	// A file with no key locks every caller out: the reload says so at WARN.
	require.NoError(t, os.WriteFile(keys, []byte("# rotated away\n"), 0o600))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return get(adminKey2) == 401 }, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
	_, err = os.Stat(sock)
	require.True(t, os.IsNotExist(err), "socket left behind")
	// JSON logs: every line an object with a message; the reload is logged, no key or secret.
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.NotEmpty(t, lines)
	for _, l := range lines {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &rec), l)
		require.NotEmpty(t, rec["msg"])
	}
	require.Contains(t, logs.String(), `"msg":"API keys reloaded"`)
	require.Regexp(t, `"level":"WARN","msg":"API keys reloaded: the file holds no key, so every /v1/ call is refused`, logs.String())
	for _, k := range []string{adminKey, adminKey2, e2eSecret} {
		require.NotContains(t, logs.String(), k)
	}
}

// TestServeSecretFileOneRule: serve's --secret-file and a worker's SHMSTEER_SECRET_FILE read one
// file through ipc's one reader, so they agree on its secret whatever its trailing newlines (serve
// used to strip them all, ipc one); a file open to group or others is still refused.
func TestServeSecretFileOneRule(t *testing.T) {
	sf := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(sf, []byte(e2eSecret+"\n\n"), 0o600))
	s := startServe(t, ns(t), "", "--secret-file", sf)
	c, err := ipc.Attach(ipc.ClientOptions{Namespace: s.ns, SecretFile: sf})
	require.NoError(t, err, "a worker reading the same file attaches")
	require.NoError(t, c.Ping())
	c.Close()
	cs, err := serve.AttachClient(s.ns, sf) // the CLI's reader
	require.NoError(t, err)
	cs.Close()

	open := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.WriteFile(open, []byte(e2eSecret), 0o644))
	cmd := exec.Command(binPath, "serve", "--http", "127.0.0.1:0", "--namespace", ns(t)+"-open", "--hidden", "8", "--layers", "2",
		"--api-key-file", writeKeys(t), "--secret-file", open)
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "chmod 600")
	require.NotContains(t, string(out), e2eSecret)
}
