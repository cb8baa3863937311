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
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/serve"
)

// The mirror's end-to-end test runs a JetStream server the way package mirror's tests do: the
// embedded nats-server, in a child process of the test binary (role selected by the
// environment), with its store in a temp dir.
const (
	natsDirEnv  = "SHMSTEER_E2E_NATS_DIR"
	natsPortEnv = "SHMSTEER_E2E_NATS_PORT"
)

// runNATSIfRequested serves JetStream on 127.0.0.1:$port until killed, when the test binary
// is re-executed in that role; it prints "ok ready" or "err ...".
func runNATSIfRequested() {
	dir := os.Getenv(natsDirEnv)
	if dir == "" {
		return
	}
	port, _ := strconv.Atoi(os.Getenv(natsPortEnv))
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		fmt.Println("err", err)
		os.Exit(1)
	}
	s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		fmt.Println("err not ready")
		os.Exit(1)
	}
	fmt.Println("ok ready")
	select {}
}

// startNATS starts the JetStream child and returns its URL; it skips the test if the server
// cannot start.
func startNATS(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), natsDirEnv+"="+filepath.Join(t.TempDir(), "js"), natsPortEnv+"="+strconv.Itoa(port))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGKILL); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		io.Copy(io.Discard, out)
	}()
	select {
	case l := <-line:
		if l != "ok ready" {
			t.Skipf("NATS (embedded nats-server with JetStream) did not start: %q", l)
		}
	case <-time.After(30 * time.Second):
		t.Skip("NATS (embedded nats-server with JetStream) did not start in 30 s")
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", port)
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// series is one unlabelled metric family scraped from /metrics.
type series struct {
	help  string
	value float64
}

func (s *served) metrics() map[string]series {
	s.t.Helper()
	resp, err := http.Get(s.addr + "/metrics")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(s.t, err)
	out := map[string]series{}
	for name, f := range fams {
		sr := series{help: f.GetHelp()}
		if ms := f.GetMetric(); len(ms) > 0 {
			if c := ms[0].GetCounter(); c != nil {
				sr.value = c.GetValue()
			} else {
				sr.value = ms[0].GetGauge().GetValue()
			}
		}
		out[name] = sr
	}
	return out
}

var mirrorSeries = []string{"connected", "ready", "initial_sync_done", "queue_depth", "queue_limit", "oldest_queued_seconds",
	"pending_in", "last_applied_timestamp_seconds", "published_total", "applied_total", "stale_total", "rejected_total",
	"tampered_total", "queue_full_total", "reconnects_total"}

// TestServeMirrorTwoHosts runs two serve processes standing in for two hosts (different
// namespaces and host ids, one secret) mirrored through one JetStream server: a vector
// registered through A's API is served by B's API and read by B's workers, a global set on B
// reaches A, a key set through A's serve reaches B's workers and its revocation on B reaches
// A, and both expose the mirror in /v1/status and /metrics.
func TestServeMirrorTwoHosts(t *testing.T) {
	url := startNATS(t)
	bucket := fmt.Sprintf("e2e-%d", os.Getpid())
	a := startServe(t, ns(t)+"-a", "", "--mirror", url, "--mirror-bucket", bucket, "--host-id", "host-a", "--mirror-keys")
	bState := filepath.Join(t.TempDir(), "state-b")
	b := startServe(t, ns(t)+"-b", bState, "--mirror", url, "--mirror-bucket", bucket, "--host-id", "host-b", "--mirror-keys")

	// A named vector registered on A is listed by B's API with the same digest.
	reg := a.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "steer", "name": "calm",
		"packed": map[string]any{"pre_attn": packed("float32", []int{1}, [][]float32{vec(1)})}})
	digest := reg["digest"].(string)
	waitFor(t, 10*time.Second, "calm on host B's API", func() bool {
		for _, v := range b.ok("GET", "/v1/steering/vectors?details=1", nil)["details"].([]any) {
			if m := v.(map[string]any); m["name"] == "calm" && m["digest"] == digest {
				return true
			}
		}
		return false
	})
	// ... and by a worker attached to B: the CLI and a client attach read B's region.
	show := exec.Command(binPath, "vectors", "show", "calm", "--namespace", b.ns)
	show.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	out, err := show.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `pre_attn\s+1\s+1\s+`, string(out))
	csB, err := serve.AttachClient(b.ns, secretFile(t))
	require.NoError(t, err)
	defer csB.Close()
	snap, err := csB.Engine.Region().Snapshot()
	require.NoError(t, err)
	nv, err := csB.Engine.Vector(&snap, "calm")
	require.NoError(t, err)
	require.Len(t, nv.Vectors, 1)
	require.Equal(t, vec(1), append([]float32(nil), nv.Vectors[0].Data...), "the mirrored vector differs")
	snap.Close()

	// A global set on B reaches A.
	require.Empty(t, a.ok("GET", "/v1/steering", nil)["active_layers"])
	b.ok("POST", "/v1/steering/set", map[string]any{"vector_refs": map[string]any{"calm": 0.5}})
	waitFor(t, 10*time.Second, "B's global steering on host A", func() bool {
		l, ok := a.ok("GET", "/v1/steering", nil)["active_layers"].(map[string]any)["1"].(map[string]any)
		return ok && l["pre_attn"] != nil && l["pre_attn"].(map[string]any)["norm"].(float64) > 0
	})

	// A key a worker sets through A's registry (keys.Attach, then Set: the owner's write reaches
	// the mirror through the registry's OnChange) reaches B's workers; revoked on B with the
	// CLI, it is revoked on A.
	csA, err := serve.AttachClient(a.ns, secretFile(t))
	require.NoError(t, err)
	defer csA.Close()
	key := []byte("per-request-key-bytes-0123456789")
	require.NoError(t, csA.Keys.Set("req-1", key))
	waitFor(t, 10*time.Second, "A's key on host B", func() bool {
		got, err := csB.Keys.Get("req-1", nil)
		return err == nil && bytes.Equal(got, key)
	})
	rm := exec.Command(binPath, "keys", "rm", "req-1", "--namespace", b.ns)
	rm.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	out, err = rm.CombinedOutput()
	require.NoError(t, err, "%s", out)
	waitFor(t, 10*time.Second, "B's revocation on host A", func() bool {
		_, err := csA.Keys.Get("req-1", nil)
		return err != nil
	})
	_, err = csA.Keys.Get("req-1", nil)
	require.ErrorIs(t, err, keys.ErrRevoked)

	// Status and metrics show the mirror on both hosts; readiness does not depend on it.
	checkMirrorShown(t, a, "host-a", bucket, 2, 1)
	checkMirrorShown(t, b, "host-b", bucket, 2, 2)

	// Changes applied from another host are persisted like local ones (within
	// persist_interval, with no local write to trigger it): after a SIGKILL, B restarted
	// without the mirror still has A's later vector.
	saves := b.ok("GET", "/v1/status", nil)["state_saves"].(float64)
	a.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "steer", "name": "later",
		"packed": map[string]any{"mlp_out": packed("float32", []int{2}, [][]float32{vec(2)})}})
	waitFor(t, 10*time.Second, "A's later vector persisted on B", func() bool {
		st := b.ok("GET", "/v1/status", nil)
		return st["named_vectors"].(float64) == 2 && st["state_saves"].(float64) > saves && st["state_dirty"] == false
	})
	b.cmd.Process.Signal(syscall.SIGKILL)
	<-b.done
	b2 := startServe(t, b.ns, bState)
	names := []string{}
	for _, v := range b2.ok("GET", "/v1/steering/vectors?details=1", nil)["details"].([]any) {
		names = append(names, v.(map[string]any)["name"].(string))
	}
	require.Equal(t, []string{"calm", "later"}, names)
	require.NoError(t, a.stop(syscall.SIGTERM))
	require.NoError(t, b2.stop(syscall.SIGTERM))
}

// TestServeMirrorOff: without --mirror, status has no mirror object and /metrics no mirror
// series; mirror settings without --mirror are a usage error.
func TestServeMirrorOff(t *testing.T) {
	s := startServe(t, ns(t), "")
	_, has := s.ok("GET", "/v1/status", nil)["mirror"]
	require.False(t, has)
	for name := range s.metrics() {
		require.False(t, strings.HasPrefix(name, "shmsteer_mirror_"), name)
	}
	cmd := exec.Command(binPath, "serve", "--namespace", ns(t)+"-x", "--host-id", "h1")
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	require.Equal(t, 2, ee.ExitCode(), "%s", out)
	require.Contains(t, string(out), "need mirror")
}

// checkMirrorShown checks that /v1/status and /metrics of s show the mirror of host id on
// bucket, connected and synced, with at least pub changes published and app applied, and that
// s is ready.
func checkMirrorShown(t *testing.T, s *served, id, bucket string, pub, app float64) {
	t.Helper()
	st := s.ok("GET", "/v1/status", nil)
	m, ok := st["mirror"].(map[string]any)
	require.True(t, ok, "no mirror in /v1/status: %v", st)
	require.Equal(t, id, m["host_id"])
	require.Equal(t, bucket, m["bucket"])
	require.Equal(t, true, m["connected"])
	require.Equal(t, true, m["initial_sync"])
	fams := s.metrics()
	for _, name := range mirrorSeries {
		f, ok := fams["shmsteer_mirror_"+name]
		require.True(t, ok, "%s: no shmsteer_mirror_%s", id, name)
		require.NotEmpty(t, f.help, "shmsteer_mirror_%s has no HELP", name)
	}
	require.Equal(t, 1.0, fams["shmsteer_mirror_connected"].value, id)
	require.Equal(t, 0.0, fams["shmsteer_mirror_queue_depth"].value, id)
	require.GreaterOrEqual(t, fams["shmsteer_mirror_published_total"].value, pub, id)
	require.GreaterOrEqual(t, fams["shmsteer_mirror_applied_total"].value, app, id)
	require.Zero(t, fams["shmsteer_mirror_rejected_total"].value, id)
	code, _ := s.call("GET", "/readyz", "", nil)
	require.Equal(t, http.StatusOK, code)
}
