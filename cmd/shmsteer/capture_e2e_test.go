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

// captureFS is serve with a capture consumer, a `capture fs` process writing under root, and
// the captureworker binary.
type captureFS struct {
	t              *testing.T
	s              *served
	root, worker   string
	cons           *exec.Cmd
	stdout, stderr lockedBuffer
	done           chan error
	exited         bool
}

// startCaptureFS builds captureworker, leaves a killed consumer's .tmp file under the root,
// starts serve and capture fs, and waits for it to attach.
func startCaptureFS(t *testing.T) *captureFS {
	dir := t.TempDir()
	e := &captureFS{t: t, root: filepath.Join(dir, "captures"), worker: filepath.Join(dir, "captureworker"), done: make(chan error, 1)}
	out, err := exec.Command("go", "build", "-o", e.worker, "../../internal/captureworker").CombinedOutput()
	require.NoError(t, err, "%s", out)
	stale := filepath.Join(e.root, "old", "r", "0_post_block.bin.tmp")
	require.NoError(t, os.MkdirAll(filepath.Dir(stale), 0o755))
	require.NoError(t, os.WriteFile(stale, []byte("killed"), 0o644))
	e.s = startServe(t, ns(t), "", "--capture-consumer", "fs=filesystem")
	e.cons = exec.Command(binPath, "capture", "fs", "--namespace", e.s.ns, "--root", e.root, "--fsync=false")
	e.cons.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	e.cons.Stdout, e.cons.Stderr = &e.stdout, &e.stderr
	require.NoError(t, e.cons.Start())
	go func() { e.done <- e.cons.Wait() }()
	t.Cleanup(func() {
		if !e.exited {
			e.cons.Process.Kill()
			<-e.done
		}
	})
	require.Eventually(t, e.attached, 30*time.Second, 50*time.Millisecond, "capture fs never attached:\n%s\n%s", e.stdout.String(), e.stderr.String())
	require.Contains(t, e.stdout.String(), "capture fs: removed 1 stale .tmp files")
	_, err = os.Stat(stale)
	require.ErrorIs(t, err, os.ErrNotExist)
	return e
}

// attached says whether serve's status shows the consumer attached.
func (e *captureFS) attached() bool {
	_, st := e.s.call("GET", "/v1/status", adminKey, nil)
	c, _ := st["capture"].(map[string]any)
	list, _ := c["consumers"].([]any)
	return len(list) == 1 && list[0].(map[string]any)["attached"] == true
}

// capture admits request id with key, capturing layer 0's post_block at every position under
// tag "shared" and request_id specID, steps it with a captureworker process (step; workerArgs
// its extra flags), ends it and returns the consumer's result once it is not pending.
func (e *captureFS) capture(key, id, specID string, step bool, workerArgs ...string) map[string]any {
	t, s := e.t, e.s
	t.Helper()
	spec := map[string]any{"fs": map[string]any{"request_id": specID, "tag": "shared", "hooks": map[string]any{"post_block": []int{0}}, "positions": "all"}}
	code, m := s.call("POST", "/v1/requests/admit", key, map[string]any{"request_id": id, "prompt_len": 4, "capture": spec})
	require.Equal(t, 200, code, "%v", m)
	if step {
		w := exec.Command(e.worker, append([]string{"--namespace", s.ns, "--request", id, "--prompt-len", "4", "--decode", "1"}, workerArgs...)...)
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
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, all := s.call("GET", "/v1/requests/"+url.PathEscape(id)+"/capture", key, nil)
		require.Equal(t, 200, code, "%v", all)
		res, _ := all["fs"].(map[string]any)
		require.NotNil(t, res, "%v", all)
		if res["status"] != "pending" {
			return res
		}
		require.True(t, time.Now().Before(deadline), "%s stays pending", id)
	}
}

func sidecar(t *testing.T, dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "0_post_block.json"))
	require.NoError(t, err)
	return string(b)
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
	e := startCaptureFS(t)
	dirs := map[string]string{}
	for i, c := range []struct{ key, id, tenant string }{{acmeKey, "acme/x", "@acme"}, {otherKey, "other/x", "@other"}} {
		var hostile []string
		if i == 0 {
			hostile = []string{"--try-resize"}
		}
		r := e.capture(c.key, c.id, "x", true, hostile...)
		require.Equal(t, "ok", r["status"], "%v", r)
		paths := r["payload"].([]any)
		require.Len(t, paths, 2)
		dirs[c.id] = filepath.Dir(paths[0].(string))
		require.Equal(t, filepath.Join(e.root, c.tenant, "shared", "x"), dirs[c.id])
		var meta struct {
			RequestID string `json:"request_id"`
			Shape     []int  `json:"shape"`
		}
		require.NoError(t, json.Unmarshal([]byte(sidecar(t, dirs[c.id])), &meta))
		require.Equal(t, c.id, meta.RequestID)
		require.Equal(t, []int{5, e2eHidden}, meta.Shape)
	}
	// After the hostile worker, serve's /metrics (unauthenticated) and capture fs are alive.
	resp, err := http.Get(e.s.addr + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, string(body), "shmsteer_capture_records_total")
	require.True(t, e.attached(), "capture fs detached after the hostile worker:\n%s", e.stderr.String())
	// acme again into its own earlier directory: error, the earlier files unchanged.
	before := sidecar(t, dirs["acme/x"])
	r := e.capture(acmeKey, "acme/y", "x", true)
	require.Equal(t, "error", r["status"], "%v", r)
	require.Contains(t, r["error"], "exists")
	require.Equal(t, before, sidecar(t, dirs["acme/x"]))
	// No worker captured it: error, saying so.
	r = e.capture(acmeKey, "acme/z", "z", false)
	require.Equal(t, "error", r["status"], "%v", r)
	require.Contains(t, r["error"], "no rows were captured")
	e.stopServeThenConsumer()
	require.Contains(t, e.lastLine(), "capture fs: 4 requests (2 ok, 0 partial, 2 failed)")
}

// stopServeThenConsumer stops serve: capture fs says it attaches again, neither exits nor
// prints an error; then SIGTERM ends it with status 0.
func (e *captureFS) stopServeThenConsumer() {
	t := e.t
	require.NoError(t, e.s.stop(syscall.SIGTERM))
	require.Eventually(t, func() bool { return strings.Contains(e.stdout.String(), "attaching again") }, 30*time.Second, 20*time.Millisecond,
		"capture fs did not say it follows the owner:\n%s\n%s", e.stdout.String(), e.stderr.String())
	select {
	case err := <-e.done:
		e.exited = true
		t.Fatalf("capture fs exited when serve stopped: %v\n%s", err, e.stderr.String())
	case <-time.After(200 * time.Millisecond):
	}
	e.cons.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-e.done:
		e.exited = true
		require.NoError(t, err, "%s", e.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("capture fs did not exit on SIGTERM")
	}
	require.NotContains(t, e.stdout.String()+e.stderr.String(), "hub is gone")
}

// lastLine is capture fs's last line of output.
func (e *captureFS) lastLine() string {
	sc := bufio.NewScanner(strings.NewReader(e.stdout.String()))
	var last string
	for sc.Scan() {
		last = sc.Text()
	}
	return last
}
