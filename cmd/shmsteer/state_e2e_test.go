package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/serve"
)

// runServeExpectFail runs serve on dir and requires that it refuses to start; it returns the
// exit code and stderr.
func runServeExpectFail(t *testing.T, ns, dir string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a serve that starts is killed
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "serve", "--http", "127.0.0.1:0", "--namespace", ns, "--hidden", fmt.Sprint(e2eHidden),
		"--layers", fmt.Sprint(e2eLayers), "--arena-bytes", fmt.Sprint(64<<20), "--state-dir", dir)
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NotContains(t, stdout.String(), "listening on", "serve started:\n%s", stderr.String())
	ee, ok := err.(*exec.ExitError)
	require.True(t, ok && ctx.Err() == nil, "serve started: %v\n%s", err, stderr.String())
	return ee.ExitCode(), stderr.String()
}

// The state directory's lock is a flock on the directory itself: deleting a lock file inside
// (the old lock) does not let a second serve in. Before, the second serve started on the same
// state directory once the lock file was removed.
func TestServeStateLockSurvivesDeletedLockFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir)
	populate(t, s)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if e.Name() == "lock" {
			require.NoError(t, os.Remove(filepath.Join(dir, "lock")))
		}
	}
	_, msg := runServeExpectFail(t, ns(t)+"-second", dir)
	require.Contains(t, msg, "state directory in use by another process")
	require.NoError(t, s.stop(syscall.SIGTERM))
	s = startServe(t, ns(t), dir)
	require.NoError(t, s.stop(syscall.SIGTERM))
}

// serve refuses a state directory, state file or vector file that another uid owns or that
// group or others can write (it restores whatever is there), and removes the temporary files
// that saves interrupted by a crash left. Before, a state file written by another uid was
// restored and temporary files piled up.
func TestServeStateDirMustBePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir)
	populate(t, s)
	before := snapshotState(s)
	require.NoError(t, s.stop(syscall.SIGTERM))
	state := filepath.Join(dir, "state.bin")
	ents, err := os.ReadDir(filepath.Join(dir, "vectors"))
	require.NoError(t, err)
	require.NotEmpty(t, ents)
	vector := filepath.Join(dir, "vectors", ents[0].Name())

	refused := func(what, want string) {
		t.Helper()
		code, msg := runServeExpectFail(t, ns(t), dir)
		require.Equal(t, 1, code, what)
		require.Contains(t, msg, "state directory not private", what)
		require.Contains(t, msg, want, what)
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{dir, 0o770}, {dir, 0o703}, {state, 0o620}, {state, 0o602}, {vector, 0o666}} {
		fi, err := os.Stat(c.path)
		require.NoError(t, err)
		require.NoError(t, os.Chmod(c.path, c.mode))
		refused(fmt.Sprintf("%s mode %v", c.path, c.mode), "writable by group or others")
		require.NoError(t, os.Chmod(c.path, fi.Mode().Perm()))
	}
	if os.Geteuid() == 0 {
		for _, p := range []string{dir, state, vector} {
			require.NoError(t, os.Lchown(p, 65534, 65534))
			refused(p+" owned by uid 65534", "belongs to uid 65534")
			require.NoError(t, os.Lchown(p, 0, 0))
		}
	} else {
		t.Log("foreign-owned files skipped: chown needs root (the mode checks above ran)")
	}
	require.NoError(t, os.Rename(state, state+".real"))
	require.NoError(t, os.Symlink(state+".real", state))
	refused("state.bin a symlink", "not a regular file")
	require.NoError(t, os.Remove(state))
	require.NoError(t, os.Rename(state+".real", state))

	// Leftovers of interrupted saves (writeAtomic's temporary files) are removed at start.
	var tmps []string
	for i := range 6 {
		tmps = append(tmps, filepath.Join(dir, fmt.Sprintf("state.bin.tmp-%d", 1000+i)),
			filepath.Join(dir, "vectors", fmt.Sprintf("%s.tmp-%d", ents[0].Name(), 2000+i)))
	}
	for _, p := range tmps {
		require.NoError(t, os.WriteFile(p, []byte("partial"), 0o600))
	}
	s = startServe(t, ns(t), dir)
	for _, p := range tmps {
		require.NoFileExists(t, p)
	}
	require.Contains(t, s.stderr.String(), "removed temporary files of interrupted saves")
	require.Equal(t, before, snapshotState(s), "the state is restored whole")
	require.NoError(t, s.stop(syscall.SIGTERM))
}

// snapshotState reads what must survive a restart.
func snapshotState(s *served) map[string]any {
	vecs := s.ok("GET", "/v1/steering/vectors?details=1", nil)["details"].([]any)
	for _, v := range vecs {
		delete(v.(map[string]any), "version") // region versions restart; digests must not change
	}
	// Admitted requests and workers' checksum reports are per run, like keys.
	dyn := s.ok("GET", "/v1/steering/dynamic", nil)["latches"].(map[string]any)
	delete(dyn, "requests_with_steering")
	return map[string]any{
		"vectors": vecs,
		"global":  s.ok("GET", "/v1/steering", nil)["active_layers"],
		"modules": s.ok("GET", "/v1/steering/modules", nil)["modules"],
		"latches": dyn,
	}
}

func populate(t *testing.T, s *served) {
	for i := range 3 {
		s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "steer", "name": fmt.Sprintf("v%d", i),
			"packed": map[string]any{"pre_attn": packed("float32", []int{0, 2}, [][]float32{vec(uint64(10 * i)), vec(uint64(10*i + 1))})}})
	}
	// Probes persist like steering vectors: one with its own name, one that shares a steering
	// vector's name and content (one vector file).
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "probe", "name": "p",
		"packed": map[string]any{"post_block": packed("float32", []int{3}, [][]float32{vec(60)})}})
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "probe", "name": "v9",
		"packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(61)})}})
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "steer", "name": "v9",
		"packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(61)})}})
	s.ok("POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"mlp_out": map[string]any{"1": vec(50)}},
		"decode_clamps":       map[string]any{"mlp_in": map[string]any{"0": map[string]any{"vector": vec(51), "max": 0.5}}},
		"prefill_vector_refs": map[string]float32{"v1": 0.25}})
	s.ok("POST", "/v1/steering/modules/register", map[string]any{"name": "m", "vectors": map[string]any{"pre_attn": map[string]any{"3": vec(52)}}})
	s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "a", "tenant": "acme", "conversation": "c1", "module": "m"})
	s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "b", "tenant": "acme", "conversation": "c2",
		"override": map[string]any{"vector_refs": map[string]float32{"v2": 1}, "vectors": map[string]any{"post_attn": map[string]any{"0": vec(53)}}}})
	s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "c", "tenant": "acme", "conversation": "c1"})
}

// waitPersisted waits until the latch changes of admissions are on disk.
func waitPersisted(t *testing.T, s *served) {
	require.Eventually(t, func() bool { return s.ok("GET", "/v1/status", nil)["state_dirty"] == false }, 10*time.Second, 20*time.Millisecond)
}

func TestServeRestartKeepsState(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir)
	populate(t, s)
	cs, err := serve.AttachClient(s.ns, secretFile(t))
	require.NoError(t, err)
	require.NoError(t, cs.Keys.Set("req-1", []byte("secret-key-bytes")))
	cs.Close()
	require.EqualValues(t, 1, s.ok("GET", "/v1/status", nil)["keys"])
	before := snapshotState(s)
	require.NotEmpty(t, before["global"])
	require.EqualValues(t, 2, before["latches"].(map[string]any)["latched_conversations"])
	require.Equal(t, map[string]any{"probe": []any{"p", "v9"}, "steer": []any{"v0", "v1", "v2", "v9"}}, s.ok("GET", "/v1/steering/vectors", nil)["vectors"])
	require.NoError(t, s.stop(syscall.SIGTERM), "serve must exit 0 on SIGTERM:\n%s", s.stderr)

	raw, err := os.ReadFile(filepath.Join(dir, "state.bin"))
	require.NoError(t, err)
	require.NotContains(t, string(raw), "secret-key-bytes", "keys must never be persisted")

	s2 := startServe(t, ns(t), dir)
	require.Equal(t, before, snapshotState(s2))
	require.EqualValues(t, 0, s2.ok("GET", "/v1/status", nil)["keys"], "keys must not survive a restart")
	// The restored latch still bridges, and its named vector's digest still matches.
	m := s2.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "d", "tenant": "acme", "conversation": "c2"})
	require.Equal(t, "latch", m["source"])
	require.NoError(t, s2.stop(syscall.SIGINT))
}

func TestServeKill9KeepsLastPersisted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir)
	populate(t, s)
	waitPersisted(t, s)
	before := snapshotState(s)
	require.NoError(t, s.cmd.Process.Kill())
	<-s.done

	s2 := startServe(t, ns(t), dir)
	require.Equal(t, before, snapshotState(s2))
	// A synchronous mutation is on disk before its reply, whatever follows: through the API,
	// and through the owner's RPCs from the CLI.
	s2.ok("POST", "/v1/steering/vectors/unregister", map[string]any{"kind": "steer", "name": "v0"})
	cli := exec.Command(binPath, "steer", "global", "set", "--namespace", s2.ns, "--ref", "v2=0.75")
	cli.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	out, err := cli.CombinedOutput()
	require.NoError(t, err, "%s", out)
	cli = exec.Command(binPath, "vectors", "rm", "v1", "--namespace", s2.ns)
	cli.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	out, err = cli.CombinedOutput()
	require.NoError(t, err, "%s", out)
	after := snapshotState(s2)
	require.Contains(t, fmt.Sprint(after["global"]), "pre_attn")
	require.Len(t, after["vectors"], 4, "v2 and v9, and the probes p and v9")
	require.NoError(t, s2.cmd.Process.Kill())
	<-s2.done
	s3 := startServe(t, ns(t), dir)
	require.Equal(t, after, snapshotState(s3))
}

func TestServeRefusesBadState(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir)
	populate(t, s)
	require.NoError(t, s.stop(syscall.SIGTERM))
	path := filepath.Join(dir, "state.bin")
	good, err := os.ReadFile(path)
	require.NoError(t, err)

	run := func(extra ...string) (int, string) {
		args := append([]string{"serve", "--http", "127.0.0.1:0", "--namespace", ns(t), "--hidden", fmt.Sprint(e2eHidden),
			"--layers", fmt.Sprint(e2eLayers), "--arena-bytes", fmt.Sprint(64 << 20), "--state-dir", dir}, extra...)
		cmd := exec.Command(binPath, args...)
		cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		require.NotContains(t, stdout.String(), "listening on")
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "serve started on bad state: %v", err)
		return ee.ExitCode(), stderr.String()
	}
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)/2] ^= 1
	require.NoError(t, os.WriteFile(path, flipped, 0o600))
	code, msg := run()
	require.Equal(t, 1, code)
	require.Contains(t, msg, "state file corrupt")
	require.NoError(t, os.WriteFile(path, good[:len(good)-7], 0o600))
	_, msg = run()
	require.Contains(t, msg, "state file corrupt")
	require.NoError(t, os.WriteFile(path, good, 0o600))
	code, msg = run("--layers", fmt.Sprint(e2eLayers+1))
	require.Equal(t, 1, code)
	require.Contains(t, msg, "state file incompatible")
	// A vector file that went missing is an error too, not a partial state.
	ents, err := os.ReadDir(filepath.Join(dir, "vectors"))
	require.NoError(t, err)
	require.NotEmpty(t, ents)
	require.NoError(t, os.Remove(filepath.Join(dir, "vectors", ents[0].Name())))
	_, msg = run()
	require.Contains(t, msg, "state file corrupt")
}

// TestServeKilledAtRandomPoints SIGKILLs serve at random moments while it registers vectors
// one after another; each restart must load a whole state holding every acknowledged
// registration and at most the one in flight.
func TestServeKilledAtRandomPoints(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	acked := 0
	for round := range 6 {
		s := startServe(t, ns(t), dir)
		n := s.ok("GET", "/v1/steering/vectors", nil)["count"].(float64)
		require.True(t, int(n) == acked || int(n) == acked+1, "round %d: %v vectors after a kill, %d acknowledged", round, n, acked)
		acked = int(n)
		stop := make(chan struct{})
		done := make(chan int)
		go func() {
			got := acked
			defer func() { done <- got }()
			for i := acked; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				b, _ := json.Marshal(map[string]any{"name": fmt.Sprintf("v%04d", i), "kind": "steer", "packed": map[string]any{"pre_attn": packed("float32", []int{0, 1, 2}, [][]float32{vec(uint64(i)), vec(uint64(i + 1)), vec(uint64(i + 2))})}})
				req, _ := http.NewRequest("POST", s.addr+"/v1/steering/vectors/register", bytes.NewReader(b))
				req.Header.Set("Authorization", "Bearer "+adminKey)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // killed mid-request: not acknowledged
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					return
				}
				got = i + 1
			}
		}()
		time.Sleep(time.Duration(20+r.IntN(200)) * time.Millisecond)
		s.cmd.Process.Kill()
		<-s.done
		close(stop)
		acked = <-done
	}
	s := startServe(t, ns(t), dir)
	n := s.ok("GET", "/v1/steering/vectors", nil)["count"].(float64)
	require.True(t, int(n) == acked || int(n) == acked+1, "%v vectors, %d acknowledged", n, acked)
	require.Greater(t, acked, 6)
}
