package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/serve"
	"github.com/shmsteer/shmsteer/steer"
)

// procStatus reads a "Key:  N kB" field of /proc/PID/status, in bytes.
func procStatus(t *testing.T, pid int, key string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return n << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return 0
}

func openFDs(t *testing.T, pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(t, err)
	return len(ents)
}

// At a 1,024-descriptor limit (RLIMIT_NOFILE of the serve process, set by the shell that
// execs it), 2,000 idle keep-alive connections and 200 slow request bodies leave serve able to
// attach workers and save its state: the connection cap (max_connections lowered to keep 256
// descriptors free) closes the longest-idle connection when full, the read timeout cuts the
// slow bodies, and the idle timeout closes idle connections. Before, serve accepted until it
// ran out of descriptors: the ipc owner could not accept workers and state saves failed.
func TestServeConnectionFloodKeepsDescriptorsForWorkers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	wrap := []string{"sh", "-c", `ulimit -n 1024 && exec "$@"`, "sh"}
	s := startServeVia(t, wrap, ns(t), dir, "--read-timeout", "8s", "--idle-timeout", "20s")
	pid := s.cmd.Process.Pid
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	require.NoError(t, err)
	require.Regexp(t, `Max open files\s+1024\s+1024`, string(limits))
	host := strings.TrimPrefix(s.addr, "http://")
	fds0 := openFDs(t, pid)

	// 2,000 keep-alive connections, each after one request, left idle.
	idle, served := openIdleConns(host, 2000)
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	fdsIdle := openFDs(t, pid)
	t.Logf("serve fds: %d at start, %d under 2,000 idle keep-alive connections (%d of them answered)", fds0, fdsIdle, served)
	require.Equal(t, 2000, served, "every connection is answered: the cap closes idle ones to make room")

	// 200 slow bodies: authenticated calls that declare 1 MiB and send 10 bytes.
	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	for range 200 {
		c, err := net.DialTimeout("tcp", host, 5*time.Second)
		require.NoError(t, err)
		slow = append(slow, c)
		_, err = fmt.Fprintf(c, "POST /v1/steering/set HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"vectors\"", adminKey, 1<<20)
		require.NoError(t, err)
	}
	slowAt := time.Now()
	fdsSlow := openFDs(t, pid)
	t.Logf("serve fds: %d with the 200 slow bodies added", fdsSlow)
	require.Less(t, fdsSlow, 1024-200, "the cap keeps descriptors free")

	// Workers attach (each holds a connection of the owner's) and state saves succeed, through
	// a worker's RPC and through the API.
	sec := secretFile(t)
	var workers []*serve.ClientSession
	defer func() {
		for _, w := range workers {
			w.Close()
		}
	}()
	for i := range 50 {
		cs, err := serve.AttachClient(s.ns, sec)
		require.NoError(t, err, "worker %d attaches", i)
		workers = append(workers, cs)
	}
	saves := func() float64 { return s.ok("GET", "/v1/status", nil)["state_saves"].(float64) }
	n0 := saves()
	_, err = workers[0].Engine.Register("from-worker", []steer.Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: vec(1)}})
	require.NoError(t, err)
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"name": "from-api", "kind": "steer",
		"packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(2)})}})
	st := s.ok("GET", "/v1/status", nil)
	require.GreaterOrEqual(t, saves(), n0+2, "%v", st)
	require.Nil(t, st["state_error"], "%v", st)
	t.Logf("serve fds: %d with 50 workers attached", openFDs(t, pid))

	// The read timeout cuts the slow bodies (8 s after they started).
	for _, c := range slow {
		c.SetReadDeadline(slowAt.Add(30 * time.Second))
		_, err := io.ReadAll(c)
		require.NoError(t, err, "serve closes a slow body's connection (EOF), the test's deadline did not pass")
	}
	require.Less(t, time.Since(slowAt), 25*time.Second)
	require.NoError(t, s.stop(syscall.SIGTERM))
}

// The request bodies serve reads at once are bounded, in total (max_inflight_body_bytes) and
// per tenant (max_tenant_body_bytes): 4 concurrent 250 MiB uploads and 8 concurrent 60 MiB JSON
// bodies from a tenant key get 503 (Retry-After) for what does not fit, before their bytes are
// read, and serve's peak RSS stays under 1 GiB. Before, every body was read at once (1.9 GB
// and 2.1 GB).
func TestServeConcurrentBodiesBounded(t *testing.T) {
	run := func(t *testing.T, what string, n int, size int64, key, path string, body func() io.Reader) {
		s := startServe(t, ns(t), "", "--max-body-bytes", fmt.Sprint(64<<20))
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[int]int{}
		start := make(chan struct{})
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				req, err := http.NewRequest("POST", s.addr+path, body())
				require.NoError(t, err)
				req.ContentLength = size
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				code := -1 // the server answered and closed before the client sent the body
				if err == nil {
					code = resp.StatusCode
					if code == http.StatusServiceUnavailable {
						require.Equal(t, "1", resp.Header.Get("Retry-After"))
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()
		peak := procStatus(t, s.cmd.Process.Pid, "VmHWM")
		t.Logf("%s: %d concurrent bodies of %d MiB: statuses %v, serve peak RSS %d MiB", what, n, size>>20, codes, peak>>20)
		require.GreaterOrEqual(t, codes[http.StatusServiceUnavailable]+codes[-1], 1, "bodies beyond the budget are refused")
		require.Less(t, peak, int64(1<<30), "peak RSS")
		require.NoError(t, s.stop(syscall.SIGTERM))
	}
	t.Run("uploads", func(t *testing.T) {
		const size = 250 << 20
		run(t, "uploads", 4, size, adminKey, "/v1/steering/vectors/import?name=big&format=npy", func() io.Reader {
			return io.LimitReader(zeros{}, size)
		})
	})
	t.Run("json", func(t *testing.T) {
		const size = 60 << 20
		head := []byte(`{"request_id":"acme/r","tenant":"acme","override":{"vectors":{"pre_attn":{"0":[`)
		tail := []byte(`0.5]}}}}`)
		row := bytes.Repeat([]byte("0.123456789,"), (size-len(head)-len(tail))/12)
		pad := bytes.Repeat([]byte(" "), size-len(head)-len(tail)-len(row))
		run(t, "json", 8, size, acmeKey, "/v1/requests/admit", func() io.Reader {
			return io.MultiReader(bytes.NewReader(head), bytes.NewReader(row), bytes.NewReader(pad), bytes.NewReader(tail))
		})
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestServeRefusesTooManyColumns: --columns over what the model's column pool holds
// (steer.MaxColumns) is refused by serve's config check: exit 2, a message naming the most and
// saying to lower --columns, and nothing created (no state dir, no owner answering). Before,
// shm refused it at region creation (exit 1, "bad region config ... lower one of them").
func TestServeRefusesTooManyColumns(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	most := steer.MaxColumns(steer.ModelConfig{Hidden: 4096, Layers: 32})
	cmd := exec.Command(binPath, "serve", "--http", "127.0.0.1:0", "--namespace", ns(t), "--hidden", "4096", "--layers", "32",
		"--columns", fmt.Sprint(most+1), "--api-key-file", writeKeys(t), "--state-dir", dir)
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "serve started with %d columns", most+1)
	require.Equal(t, 2, ee.ExitCode(), "%s", stderr.String())
	require.Contains(t, stderr.String(), fmt.Sprintf("shmsteer: bad serve configuration: columns %d: the region's column pool holds at most %d columns for this model", most+1, most))
	require.Contains(t, stderr.String(), "lower --columns")
	require.NotContains(t, stdout.String(), "listening on")
	require.NoDirExists(t, dir, "nothing created")
	_, err = serve.AttachClient(ns(t), secretFile(t))
	require.ErrorIs(t, err, ipc.ErrNotYetInitialized, "no owner answers")
}

// openIdleConns opens n keep-alive connections to host, each left idle after one GET /healthz,
// and counts the answered ones (200); it stops early once 20 connections in a row time out.
func openIdleConns(host string, n int) (idle []net.Conn, served int) {
	failed := 0
	for range n {
		if failed >= 20 {
			break // serve stopped answering: 20 connections in a row timed out
		}
		c, err := net.DialTimeout("tcp", host, 2*time.Second)
		if err != nil {
			failed++
			continue
		}
		idle = append(idle, c)
		c.SetDeadline(time.Now().Add(2 * time.Second))
		resp, err := func() (*http.Response, error) {
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				return nil, err
			}
			return http.ReadResponse(bufio.NewReader(c), nil)
		}()
		if err != nil {
			failed++
			continue
		}
		failed = 0
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			served++
		}
		c.SetDeadline(time.Time{})
	}
	return idle, served
}
