package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// lineWriter hands the first "listening on" line to a channel.
type lineWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	addr chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if a, ok := strings.CutPrefix(w.buf.String(), "listening on "); ok && strings.HasSuffix(a, "\n") {
		w.addr <- strings.TrimSpace(a)
	}
	return len(p), nil
}

func runInProcess(t *testing.T, cfg Config) (string, func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &lineWriter{addr: make(chan string, 1)}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, w, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	select {
	case a := <-w.addr:
		return "http://" + a, func() error { cancel(); return <-done }
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("Run did not listen")
	}
	return "", nil
}

// TestRunConcurrent runs the server in this process (so -race sees it) and drives every
// mutating endpoint, the metrics and the status from concurrent clients, then stops it and
// checks the persisted state restores.
func TestRunConcurrent(t *testing.T) {
	dir := t.TempDir()
	keyFile, secretFile := filepath.Join(dir, "keys"), filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(keyFile, []byte("admin-0123456789abcdef\n"), 0o600))
	require.NoError(t, os.WriteFile(secretFile, []byte("run-test-secret"), 0o600))
	cfg := DefaultConfig()
	cfg.Namespace = fmt.Sprintf("run-test-%d", os.Getpid())
	cfg.Hidden, cfg.Layers, cfg.ArenaBytes, cfg.IndexSlots = 8, 4, 16<<20, 1024
	cfg.HTTP, cfg.APIKeyFile, cfg.SecretFile, cfg.StateDir = "127.0.0.1:0", keyFile, secretFile, filepath.Join(dir, "state")
	cfg.PersistInterval = 5 * time.Millisecond
	addr, stop := runInProcess(t, cfg)

	do := func(method, path, body string) (int, map[string]any) {
		req, _ := http.NewRequest(method, addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer admin-0123456789abcdef")
		resp, err := http.DefaultClient.Do(req)
		if !assert.NoError(t, err) {
			return 0, nil
		}
		defer resp.Body.Close()
		var m map[string]any
		json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	v8 := func(x int) string { return fmt.Sprintf("[%d,1,0,0,0,0,0,%d]", x, x+1) }
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				name := fmt.Sprintf("n%d", g)
				switch i % 5 {
				case 0:
					code, m := do("POST", "/v1/steering/set", `{"vectors":{"pre_attn":{"`+fmt.Sprint(g)+`":`+v8(i)+`}}}`)
					assert.Equal(t, 200, code, "%v", m)
				case 1:
					code, m := do("POST", "/v1/steering/modules/register", `{"name":"`+name+`","vectors":{"mlp_out":{"1":`+v8(i)+`}}}`)
					assert.Equal(t, 200, code, "%v", m)
				case 2:
					code, m := do("POST", "/v1/requests/admit", fmt.Sprintf(`{"request_id":"r%d-%d","conversation":"c%d","module":%q}`, g, i, i%7, name))
					assert.Equal(t, 200, code, "%v", m)
				case 3:
					code, _ := do("GET", "/v1/status", "")
					assert.Equal(t, 200, code)
					resp, err := http.Get(addr + "/metrics")
					if !assert.NoError(t, err) {
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				case 4:
					code, m := do("GET", "/v1/steering/dynamic", "")
					assert.Equal(t, 200, code, "%v", m)
				}
			}
		}()
	}
	wg.Wait()
	_, st := do("GET", "/v1/status", "")
	_, dyn := do("GET", "/v1/steering/dynamic", "")
	_, glob := do("GET", "/v1/steering", "")
	require.NoError(t, stop())

	addr, stop = runInProcess(t, cfg)
	_, st2 := do("GET", "/v1/status", "")
	_, dyn2 := do("GET", "/v1/steering/dynamic", "")
	_, glob2 := do("GET", "/v1/steering", "")
	require.Equal(t, st["modules"], st2["modules"])
	require.NotEmpty(t, dyn["latches"].(map[string]any)["latch_state_hash"])
	require.Equal(t, dyn["latches"].(map[string]any)["latch_state_hash"], dyn2["latches"].(map[string]any)["latch_state_hash"])
	require.Equal(t, glob["active_layers"], glob2["active_layers"])
	require.NoError(t, stop())
}

// TestRunStateTooLargeForRegion: a saved state that does not fit a smaller region stops the
// start with an error that says what to raise.
func TestRunStateTooLargeForRegion(t *testing.T) {
	dir := t.TempDir()
	keyFile, secretFile := filepath.Join(dir, "keys"), filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(keyFile, []byte("admin-0123456789abcdef\n"), 0o600))
	require.NoError(t, os.WriteFile(secretFile, []byte("run-test-secret"), 0o600))
	cfg := DefaultConfig()
	cfg.Namespace = fmt.Sprintf("run-full-%d", os.Getpid())
	cfg.Hidden, cfg.Layers, cfg.ArenaBytes, cfg.IndexSlots = 512, 2, 16<<20, 1024
	cfg.HTTP, cfg.APIKeyFile, cfg.SecretFile, cfg.StateDir = "127.0.0.1:0", keyFile, secretFile, filepath.Join(dir, "state")
	addr, stop := runInProcess(t, cfg)
	row := "[" + strings.TrimSuffix(strings.Repeat("0.5,", 512), ",") + "]"
	for i := range 40 {
		body := fmt.Sprintf(`{"name":"v%d","kind":"steer","packed":{"pre_attn":%s}}`, i, packedJSON(t, row))
		req, _ := http.NewRequest("POST", addr+"/v1/steering/vectors/register", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer admin-0123456789abcdef")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
	}
	require.NoError(t, stop())
	cfg.ArenaBytes = 64 << 10
	err := Run(context.Background(), cfg, io.Discard, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorIs(t, err, ErrStateIncompatible)
	require.Contains(t, err.Error(), "raise --arena-bytes")
}

// packedJSON packs one float32 row given as a JSON array for layer 0.
func packedJSON(t *testing.T, row string) string {
	var v []float32
	require.NoError(t, json.Unmarshal([]byte(row), &v))
	p := packVectors([]steer.Vector{{Layer: 0, Scale: 1, Data: v}})
	b, err := json.Marshal(p)
	require.NoError(t, err)
	return string(b)
}
