package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
)

// lockedBuffer is a bytes.Buffer a process writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Two tenants capturing through serve, `capture fs` and a worker process each, with the same
// spec (tag and request_id): each tenant's rows land under its own directory; a later request
// of a tenant naming its earlier one's tag and request_id gets error and changes nothing of the
// earlier's files; a request no worker captured is error. capture fs removes the .tmp files a
// killed consumer left at start; a worker that tries to resize its ring after registering it
// fails (EPERM) and serve's /metrics and capture fs go on; when serve stops, capture fs neither
// exits nor prints an error, and SIGTERM then ends it with status 0.
func TestCaptureFSTenantsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	worker := filepath.Join(dir, "captureworker")
	out, err := exec.Command("go", "build", "-o", worker, "../../internal/captureworker").CombinedOutput()
	require.NoError(t, err, "%s", out)
	root := filepath.Join(dir, "captures")
	stale := filepath.Join(root, "old", "r", "0_post_block.bin.tmp")
	require.NoError(t, os.MkdirAll(filepath.Dir(stale), 0o755))
	require.NoError(t, os.WriteFile(stale, []byte("killed"), 0o644))

	s := startServe(t, ns(t), "", "--capture-consumer", "fs=filesystem")
	cons := exec.Command(binPath, "capture", "fs", "--namespace", s.ns, "--root", root, "--fsync=false")
	cons.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	var stdout, stderr lockedBuffer
	cons.Stdout, cons.Stderr = &stdout, &stderr
	require.NoError(t, cons.Start())
	consDone := make(chan error, 1)
	go func() { consDone <- cons.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			cons.Process.Kill()
			<-consDone
		}
	})
	attached := func() bool {
		_, st := s.call("GET", "/v1/status", adminKey, nil)
		c, _ := st["capture"].(map[string]any)
		list, _ := c["consumers"].([]any)
		return len(list) == 1 && list[0].(map[string]any)["attached"] == true
	}
	require.Eventually(t, attached, 30*time.Second, 50*time.Millisecond, "capture fs never attached:\n%s\n%s", stdout.String(), stderr.String())
	require.Contains(t, stdout.String(), "capture fs: removed 1 stale .tmp files")
	_, err = os.Stat(stale)
	require.ErrorIs(t, err, os.ErrNotExist)

	spec := func(id string, positions string) map[string]any {
		return map[string]any{"fs": map[string]any{"request_id": id, "tag": "shared", "hooks": map[string]any{"post_block": []int{0}}, "positions": positions}}
	}
	capture := func(key, id string, specID string, step bool, workerArgs ...string) map[string]any {
		t.Helper()
		code, m := s.call("POST", "/v1/requests/admit", key, map[string]any{"request_id": id, "prompt_len": 4, "capture": spec(specID, "all")})
		require.Equal(t, 200, code, "%v", m)
		if step {
			w := exec.Command(worker, append([]string{"--namespace", s.ns, "--request", id, "--prompt-len", "4", "--decode", "1"}, workerArgs...)...)
			w.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
			out, err := w.CombinedOutput()
			require.NoError(t, err, "%s", out)
			if len(workerArgs) > 0 {
				// A hostile worker cannot resize its registered ring (sealed).
				require.Contains(t, string(out), "resizing the ring to 0 bytes: operation not permitted")
				require.Contains(t, string(out), "resizing the ring to 1073741824 bytes: operation not permitted")
			}
		}
		code, m = s.call("POST", "/v1/requests/end", key, map[string]any{"request_id": id})
		require.Equal(t, 200, code, "%v", m)
		var res map[string]any
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			code, all := s.call("GET", "/v1/requests/"+url.PathEscape(id)+"/capture", key, nil)
			require.Equal(t, 200, code, "%v", all)
			res, _ = all["fs"].(map[string]any)
			require.NotNil(t, res, "%v", all)
			if res["status"] != "pending" {
				return res
			}
			require.True(t, time.Now().Before(deadline), "%s stays pending", id)
		}
	}
	sidecar := func(dir string) string {
		b, err := os.ReadFile(filepath.Join(dir, "0_post_block.json"))
		require.NoError(t, err)
		return string(b)
	}
	dirs := map[string]string{}
	for i, c := range []struct{ key, id, tenant string }{{acmeKey, "acme/x", "@acme"}, {otherKey, "other/x", "@other"}} {
		var hostile []string
		if i == 0 {
			hostile = []string{"--try-resize"}
		}
		r := capture(c.key, c.id, "x", true, hostile...)
		require.Equal(t, "ok", r["status"], "%v", r)
		paths := r["payload"].([]any)
		require.Len(t, paths, 2)
		dirs[c.id] = filepath.Dir(paths[0].(string))
		require.Equal(t, filepath.Join(root, c.tenant, "shared", "x"), dirs[c.id])
		var meta struct {
			RequestID string `json:"request_id"`
			Shape     []int  `json:"shape"`
		}
		require.NoError(t, json.Unmarshal([]byte(sidecar(dirs[c.id])), &meta))
		require.Equal(t, c.id, meta.RequestID)
		require.Equal(t, []int{5, e2eHidden}, meta.Shape)
	}
	// After the hostile worker, serve's /metrics (unauthenticated) and capture fs are alive.
	resp, err := http.Get(s.addr + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, string(body), "shmsteer_capture_records_total")
	require.True(t, attached(), "capture fs detached after the hostile worker:\n%s", stderr.String())
	// acme again into its own earlier directory: error, the earlier files unchanged.
	before := sidecar(dirs["acme/x"])
	r := capture(acmeKey, "acme/y", "x", true)
	require.Equal(t, "error", r["status"], "%v", r)
	require.Contains(t, r["error"], "exists")
	require.Equal(t, before, sidecar(dirs["acme/x"]))
	// No worker captured it: error, saying so.
	r = capture(acmeKey, "acme/z", "z", false)
	require.Equal(t, "error", r["status"], "%v", r)
	require.Contains(t, r["error"], "no rows were captured")

	// serve stops: capture fs waits for an owner (no error), and SIGTERM ends it cleanly.
	require.NoError(t, s.stop(syscall.SIGTERM))
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "attaching again") }, 30*time.Second, 20*time.Millisecond,
		"capture fs did not say it follows the owner:\n%s\n%s", stdout.String(), stderr.String())
	select {
	case err := <-consDone:
		exited = true
		t.Fatalf("capture fs exited when serve stopped: %v\n%s", err, stderr.String())
	case <-time.After(200 * time.Millisecond):
	}
	cons.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-consDone:
		exited = true
		require.NoError(t, err, "%s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("capture fs did not exit on SIGTERM")
	}
	require.NotContains(t, stdout.String()+stderr.String(), "hub is gone")
	sc := bufio.NewScanner(strings.NewReader(stdout.String()))
	var last string
	for sc.Scan() {
		last = sc.Text()
	}
	require.Contains(t, last, "capture fs: 4 requests (2 ok, 0 partial, 2 failed)")
}
