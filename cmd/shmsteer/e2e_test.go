package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/serve"
)

// binPath is the shmsteer binary TestMain builds.
var binPath string

const (
	adminKey  = "admin-key-0123456789abcdef"
	adminKey2 = "admin-key-rotated-0123456789"
	acmeKey   = "acme-key-0123456789abcdef"
	otherKey  = "other-key-0123456789abcdef"
	e2eSecret = "e2e-secret-value-not-in-logs"
	e2eHidden = 16
	e2eLayers = 4
)

// served is one `shmsteer serve` process.
type served struct {
	t        testing.TB
	cmd      *exec.Cmd
	addr     string
	ns       string
	stateDir string
	stderr   *bytes.Buffer
	done     chan error
}

func writeKeys(t testing.TB) string {
	p := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(p, []byte("# keys\n"+adminKey+"\n"+adminKey2+"\nacme:"+acmeKey+"\nother:"+otherKey+"\n"), 0o600))
	return p
}

// startServe starts serve and waits for its "listening on" line.
func startServe(t testing.TB, ns, stateDir string, extra ...string) *served {
	t.Helper()
	return startServeVia(t, nil, ns, stateDir, extra...)
}

// startServeVia is startServe with the binary run through the command wrap (for example a
// shell that lowers a limit and execs its arguments); nil runs it directly.
func startServeVia(t testing.TB, wrap []string, ns, stateDir string, extra ...string) *served {
	t.Helper()
	args := []string{"serve", "--http", "127.0.0.1:0", "--namespace", ns, "--hidden", fmt.Sprint(e2eHidden),
		"--layers", fmt.Sprint(e2eLayers), "--arena-bytes", fmt.Sprint(64 << 20), "--index-slots", "4096",
		"--api-key-file", writeKeys(t), "--persist-interval", "100ms"}
	// Later flags win: extra may override the model and sizes.
	if stateDir != "" {
		args = append(args, "--state-dir", stateDir)
	}
	args = append(args, extra...)
	argv := append(append(wrap[:len(wrap):len(wrap)], binPath), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	s := &served{t: t, cmd: cmd, ns: ns, stateDir: stateDir, stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	cmd.Stderr = s.stderr
	require.NoError(t, cmd.Start())
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				line <- a
			}
		}
		close(line)
	}()
	go func() { s.done <- cmd.Wait() }()
	select {
	case a, ok := <-line:
		require.True(t, ok, "serve exited before listening:\n%s", s.stderr)
		s.addr = "http://" + a
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("serve did not listen in 30 s:\n%s", s.stderr)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-s.done
		}
		require.NotContains(t, s.stderr.String(), e2eSecret, "the secret leaked into the log")
		for _, k := range []string{adminKey, acmeKey, otherKey} {
			require.NotContains(t, s.stderr.String(), k, "an API key leaked into the log")
		}
	})
	return s
}

// stop sends sig and waits for the exit.
func (s *served) stop(sig syscall.Signal) error {
	s.cmd.Process.Signal(sig)
	select {
	case err := <-s.done:
		return err
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		return fmt.Errorf("serve did not exit on %v", sig)
	}
}

// call does an HTTP request and decodes a JSON reply into a map.
func (s *served) call(method, path, key string, body any) (int, map[string]any) {
	s.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		require.NoError(s.t, err)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.addr+path, rd)
	require.NoError(s.t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	var m map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(s.t, json.Unmarshal(raw, &m), "%s", raw)
	}
	return resp.StatusCode, m
}

func (s *served) ok(method, path string, body any) map[string]any {
	s.t.Helper()
	code, m := s.call(method, path, adminKey, body)
	require.Equal(s.t, http.StatusOK, code, "%s %s: %v", method, path, m)
	return m
}

func vec(seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	v := make([]float32, e2eHidden)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// packed encodes rows for layers in dtype.
func packed(dtype string, layers []int, rows [][]float32) map[string]any {
	var raw []byte
	for _, r := range rows {
		for _, f := range r {
			switch dtype {
			case "float32":
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
			case "float64":
				raw = binary.LittleEndian.AppendUint64(raw, math.Float64bits(float64(f)))
			case "bfloat16":
				raw = binary.LittleEndian.AppendUint16(raw, uint16(math.Float32bits(f)>>16))
			case "float16":
				raw = binary.LittleEndian.AppendUint16(raw, toHalf(f))
			}
		}
	}
	return map[string]any{"dtype": dtype, "shape": []int{len(rows), e2eHidden}, "layer_indices": layers,
		"data": base64.StdEncoding.EncodeToString(raw)}
}

// toHalf rounds toward zero to binary16 (normal range only: test data stays in it).
func toHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	if exp <= 0 {
		return sign
	}
	return sign | uint16(exp)<<10 | uint16((b>>13)&0x3ff)
}

// secretFile writes the serve processes' secret to a file for in-process clients.
func secretFile(t testing.TB) string {
	p := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(p, []byte(e2eSecret+"\n"), 0o600))
	return p
}

func ns(t testing.TB) string { return fmt.Sprintf("e2e-%s-%d", t.Name(), os.Getpid()) }

func TestCLIHelpAndExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		stdout   string
		stderr   string
		noStdout bool
	}{
		{[]string{"--help"}, 0, "Available Commands", "", false},
		{[]string{"help", "serve"}, 0, "--api-key-file", "", false},
		{[]string{"serve", "--help"}, 0, "--state-dir", "", false},
		{[]string{"help", "keys"}, 0, "ls", "", false},
		{[]string{"help", "demo"}, 0, "-workers", "", false},
		{[]string{"help", "bench"}, 0, "-json FILE", "", false},
		{[]string{"vectors", "show", "--help"}, 0, "--secret-file", "", false},
		{[]string{"steer", "global", "set", "--help"}, 0, "--ref", "", false},
		{[]string{"version"}, 0, "shmsteer v", "", false},
		{[]string{"--version"}, 0, "shmsteer v", "", false},
		{[]string{"completion", "bash"}, 0, "bash completion", "", false},
		{[]string{}, 2, "Available Commands", "", false},
		{[]string{"bogus"}, 2, "", "unknown command \"bogus\"", true},
		{[]string{"keys", "bogus"}, 2, "", "unknown command", true},
		{[]string{"serve", "--nope"}, 2, "", "unknown flag: --nope", true},
		{[]string{"serve", "--hidden", "x"}, 2, "", "invalid argument", true},
		{[]string{"serve", "--hidden", "0"}, 2, "", "hidden size 0", true},
		{[]string{"serve", "--latch-policy", "random"}, 2, "", "latch_policy", true},
		{[]string{"vectors", "show"}, 2, "", "takes 1 argument", true},
		{[]string{"status", "--namespace", "e2e-nobody-here"}, 1, "", "no owner answers", true},
		{[]string{"demo", "--nope"}, 2, "", "unknown flag: --nope", true},
		{[]string{"demo", "extra"}, 2, "", "takes 0 argument(s)", true},
		{[]string{"demo", "--workers", "0"}, 2, "", "--workers must be at least 1 (got 0)", true},
		{[]string{"bench", "--help"}, 0, "--only PREFIXES", "", false},
		{[]string{"bench", "--bogus"}, 2, "", "unknown flag: --bogus", true},
		{[]string{"bench", "extra"}, 2, "", "takes 0 argument(s)", true},
		{[]string{"bench", "--rounds", "-1"}, 2, "", "--rounds -1 is negative", true},
		{[]string{"bench", "--plot", "chart.txt"}, 2, "", ".png or .svg", true},
	} {
		t.Run(strings.Join(tc.args, "_"), func(t *testing.T) {
			cmd := exec.Command(binPath, tc.args...)
			cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.code, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			require.Contains(t, stdout.String(), tc.stdout)
			require.Contains(t, stderr.String(), tc.stderr)
			if tc.noStdout {
				require.Empty(t, stdout.String())
			}
		})
	}
}

// TestServeEndpoints drives every endpoint's happy path and bad paths; a bad request changes
// nothing (the region version and the global steering stay the same).
func TestServeEndpoints(t *testing.T) {
	s := startServe(t, ns(t), "", "--max-body-bytes", "65536")
	bad := refusedUnchanged(t, s)
	endpointsGlobal(t, s, bad)
	endpointsVectors(t, s, bad)
	endpointsModulesAdmissions(t, s, bad)
	s.ok("POST", "/v1/steering/modules/unregister", map[string]any{"name": "mod"})
	s.ok("POST", "/v1/steering/vectors/unregister", map[string]any{"name": "happy", "kind": "steer"})
	s.ok("POST", "/v1/steering/clear", nil)
	require.Empty(t, s.ok("GET", "/v1/steering", nil)["active_layers"])
	require.NoError(t, s.stop(syscall.SIGTERM))
}

// refusedFunc runs one bad request as subtest "bad/"+name: it must get code and error type typ.
type refusedFunc func(name, method, path string, body any, code int, typ string)

// refusedUnchanged is TestServeEndpoints' bad-request check: the refused request also changes
// neither the region version nor the global steering.
func refusedUnchanged(t *testing.T, s *served) refusedFunc {
	state := func() (float64, map[string]any) {
		st := s.ok("GET", "/v1/status", nil)
		g := s.ok("GET", "/v1/steering", nil)
		return st["version"].(float64), g["active_layers"].(map[string]any)
	}
	return func(name, method, path string, body any, code int, typ string) {
		t.Run("bad/"+name, func(t *testing.T) {
			v0, g0 := state()
			c, m := s.call(method, path, adminKey, body)
			require.Equal(t, code, c, "%v", m)
			require.Equal(t, typ, m["type"], "%v", m)
			v1, g1 := state()
			require.Equal(t, v0, v1, "a refused request changed the region")
			require.Equal(t, g0, g1)
		})
	}
}

// endpointsGlobal: global steering in the plain form, every packed dtype and clamps; replace;
// set's and clear's bad requests.
func endpointsGlobal(t *testing.T, s *served, bad refusedFunc) {
	t.Helper()
	// Global steering in the plain form, every packed dtype and clamps.
	m := s.ok("POST", "/v1/steering/set", map[string]any{
		"vectors":         map[string]any{"pre_attn": map[string]any{"0": vec(1), "1": map[string]any{"vector": vec(2), "scale": 2}}},
		"prefill_vectors": map[string]any{"post_attn": packed("float16", []int{2, 3}, [][]float32{vec(3), vec(4)})},
		"decode_vectors":  map[string]any{"mlp_out": packed("bfloat16", []int{1}, [][]float32{vec(5)})},
		"clamps":          map[string]any{"mlp_in": map[string]any{"2": []any{map[string]any{"vector": vec(6), "value": 0}}}},
		"decode_clamps":   map[string]any{"mlp_in": map[string]any{"3": map[string]any{"vector": vec(7), "min": -1, "max": 1, "strength": 0.5}}},
	})
	require.Equal(t, []any{"mlp_in", "mlp_out", "post_attn", "pre_attn"}, m["hook_points"])
	require.Equal(t, []any{0.0, 1.0, 2.0, 3.0}, m["layers_updated"])
	g := s.ok("GET", "/v1/steering", nil)["active_layers"].(map[string]any)
	l1 := g["1"].(map[string]any)["pre_attn"].(map[string]any)
	var ss float64
	for _, f := range vec(2) {
		ss += 4 * float64(f) * float64(f)
	}
	require.InDelta(t, math.Sqrt(ss), l1["norm"], 1e-4)
	require.NotContains(t, l1, "prefill_norm", "zero norms are left out")
	clamps := s.ok("GET", "/v1/steering", nil)["clamps"].(map[string]any)
	require.EqualValues(t, 1, clamps["2"].(map[string]any)["mlp_in"])
	require.Contains(t, g, "3")

	// replace=false keeps other sites; float32/float64 packed land the same values.
	s.ok("POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"pre_attn": packed("float64", []int{0}, [][]float32{vec(9)})}})
	g = s.ok("GET", "/v1/steering", nil)["active_layers"].(map[string]any)
	require.Contains(t, g, "3", "replace=false dropped other sites")
	s.ok("POST", "/v1/steering/set", map[string]any{"replace": true, "vectors": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(9)})}})
	g = s.ok("GET", "/v1/steering", nil)["active_layers"].(map[string]any)
	require.Len(t, g, 1, "replace=true kept other sites")

	bad("unknown hook", "POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"nope": map[string]any{"0": vec(1)}}}, 400, "unknown_hook")
	bad("layer range", "POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"9": vec(1)}}}, 400, "layer_range")
	bad("negative layer key", "POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"-1": vec(1)}}}, 400, "bad_request")
	bad("hidden size", "POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"0": []float32{1, 2}}}}, 400, "hidden_size")
	bad("non-finite", "POST", "/v1/steering/set", `{"vectors":{"pre_attn":{"0":{"vector":[`+strings.Repeat("1,", e2eHidden-1)+`1],"scale":1e39}}}}`, 400, "non_finite")
	bad("overflow", "POST", "/v1/steering/set", `{"vectors":{"pre_attn":{"0":{"vector":[`+strings.Repeat("1,", e2eHidden-1)+`1],"scale":1e31}}}}`, 400, "overflow")
	bad("unknown field", "POST", "/v1/steering/set", map[string]any{"vectorz": 1}, 400, "bad_request")
	bad("not json", "POST", "/v1/steering/set", "{", 400, "bad_request")
	bad("empty", "POST", "/v1/steering/set", map[string]any{}, 400, "bad_request")
	bad("target", "POST", "/v1/steering/set", map[string]any{"target": "draft", "vectors": map[string]any{"pre_attn": map[string]any{"0": vec(1)}}}, 400, "bad_request")
	bad("packed shape", "POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"dtype": "float32", "shape": []int{1, 3}, "layer_indices": []int{0}, "data": "AAAA"}}}, 400, "bad_request")
	bad("packed dtype", "POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"dtype": "int8", "shape": []int{1, e2eHidden}, "layer_indices": []int{0}, "data": ""}}}, 400, "bad_request")
	bad("packed short data", "POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"dtype": "float32", "shape": []int{1, e2eHidden}, "layer_indices": []int{0}, "data": "AAAA"}}}, 400, "bad_request")
	bad("packed duplicate layer", "POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"pre_attn": packed("float32", []int{1, 1}, [][]float32{vec(1), vec(2)})}}, 400, "duplicate")
	bad("clamp value and min", "POST", "/v1/steering/set", map[string]any{"clamps": map[string]any{"mlp_in": map[string]any{"0": map[string]any{"vector": vec(1), "value": 0, "min": 1}}}}, 400, "bad_clamp")
	bad("clamp zero vector", "POST", "/v1/steering/set", map[string]any{"clamps": map[string]any{"mlp_in": map[string]any{"0": map[string]any{"vector": make([]float32, e2eHidden), "value": 0}}}}, 400, "bad_clamp")
	bad("clamp min above max", "POST", "/v1/steering/set", map[string]any{"clamps": map[string]any{"mlp_in": map[string]any{"0": map[string]any{"vector": vec(1), "min": 2, "max": 1}}}}, 400, "bad_clamp")
	bad("unknown ref", "POST", "/v1/steering/set", map[string]any{"vector_refs": map[string]float32{"nope": 1}}, 400, "unknown_vector")
	bad("body too large", "POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"0": make([]float32, 40000)}}}, 413, "too_large")
	bad("clear unknown field", "POST", "/v1/steering/clear", map[string]any{"x": 1}, 400, "bad_request")
}

// endpointsVectors: the layers map and named vectors.
func endpointsVectors(t *testing.T, s *served, bad refusedFunc) {
	t.Helper()
	// Layers: the fork's flat map.
	lay := s.ok("GET", "/v1/steering/layers", nil)["layers"].(map[string]any)
	require.Len(t, lay, e2eLayers)
	require.Equal(t, []any{"mlp_in", "mlp_out", "post_attn", "post_block", "pre_attn"}, lay["0"].(map[string]any)["hook_points"])

	// Named vectors.
	m := s.ok("POST", "/v1/steering/vectors/register", map[string]any{"name": "happy", "kind": "steer",
		"packed": map[string]any{"pre_attn": packed("float32", []int{0, 1}, [][]float32{vec(10), vec(11)}), "mlp_out": packed("float16", []int{3}, [][]float32{vec(12)})}})
	require.Equal(t, "happy", m["name"])
	list := s.ok("GET", "/v1/steering/vectors?details=1", nil)
	require.EqualValues(t, 1, list["count"])
	require.Equal(t, map[string]any{"probe": []any{}, "steer": []any{"happy"}}, list["vectors"])
	require.EqualValues(t, 3, list["details"].([]any)[0].(map[string]any)["entries"])
	bad("register probe of two sites", "POST", "/v1/steering/vectors/register", map[string]any{"name": "p", "kind": "probe",
		"packed": map[string]any{"pre_attn": packed("float32", []int{0, 1}, [][]float32{vec(1), vec(2)})}}, 400, "probe_site")
	bad("register empty", "POST", "/v1/steering/vectors/register", map[string]any{"name": "e", "kind": "steer", "packed": map[string]any{}}, 400, "bad_request")
	bad("register no kind", "POST", "/v1/steering/vectors/register", map[string]any{"name": "e", "packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(1)})}}, 400, "bad_request")
	bad("register bad name", "POST", "/v1/steering/vectors/register", map[string]any{"name": "", "kind": "steer", "packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(1)})}}, 400, "bad_name")
	bad("unregister unknown", "POST", "/v1/steering/vectors/unregister", map[string]any{"name": "nope", "kind": "steer"}, 404, "not_found")
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"name": "happy", "kind": "probe",
		"packed": map[string]any{"post_block": packed("float32", []int{2}, [][]float32{vec(15)})}})
	list = s.ok("GET", "/v1/steering/vectors", nil)
	require.Equal(t, map[string]any{"probe": []any{"happy"}, "steer": []any{"happy"}}, list["vectors"])
	s.ok("POST", "/v1/steering/vectors/unregister", map[string]any{"name": "happy", "kind": "probe"})
	s.ok("POST", "/v1/steering/set", map[string]any{"vector_refs": map[string]float32{"happy": 0.5}})
}

// endpointsModulesAdmissions: modules, and admissions that latch conversations (DELETE drops
// them).
func endpointsModulesAdmissions(t *testing.T, s *served, bad refusedFunc) {
	t.Helper()
	// Modules.
	m := s.ok("POST", "/v1/steering/modules/register", map[string]any{"name": "mod", "vectors": map[string]any{"pre_attn": map[string]any{"2": vec(13)}},
		"decode_clamps": map[string]any{"mlp_in": map[string]any{"0": map[string]any{"vector": vec(14), "value": 0}}}})
	require.Equal(t, []any{"mod"}, m["modules"])
	require.EqualValues(t, 1, s.ok("GET", "/v1/steering/modules", nil)["count"])
	bad("module sae", "POST", "/v1/steering/modules/register", map[string]any{"name": "sae", "kind": "sae_delta"}, 501, "not_implemented")
	bad("module empty", "POST", "/v1/steering/modules/register", map[string]any{"name": "e"}, 400, "bad_request")
	bad("module unknown", "POST", "/v1/steering/modules/unregister", map[string]any{"name": "nope"}, 404, "not_found")

	// Admissions latch conversations; DELETE drops them.
	m = s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "r1", "tenant": "acme", "conversation": "c1", "module": "mod"})
	require.Equal(t, "override", m["source"])
	require.Equal(t, true, m["latched"])
	m = s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "r2", "tenant": "acme", "conversation": "c1"})
	require.Equal(t, "latch", m["source"])
	s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "r3", "tenant": "acme", "conversation": "c2",
		"override": map[string]any{"vector_refs": map[string]float32{"happy": 1}}, "compose": "add"})
	dyn := s.ok("GET", "/v1/steering/dynamic", nil)["latches"].(map[string]any)
	require.EqualValues(t, 2, dyn["latched_conversations"])
	require.EqualValues(t, 2, dyn["triggers"])
	require.EqualValues(t, 1, dyn["bridges"])
	require.EqualValues(t, 3, s.ok("GET", "/v1/status", nil)["requests_with_steering"])
	s.ok("POST", "/v1/requests/end", map[string]any{"request_id": "r1"})
	require.EqualValues(t, 2, s.ok("GET", "/v1/status", nil)["requests_with_steering"])
	bad("admit bad id", "POST", "/v1/requests/admit", map[string]any{"request_id": ""}, 400, "bad_request_id")
	bad("admit unknown module", "POST", "/v1/requests/admit", map[string]any{"request_id": "x", "module": "nope"}, 404, "not_found")
	bad("admit compose", "POST", "/v1/requests/admit", map[string]any{"request_id": "x", "compose": "mul"}, 400, "bad_request")
	s.ok("DELETE", "/v1/conversations/acme/c1", nil)
	require.EqualValues(t, 1, s.ok("GET", "/v1/steering/dynamic", nil)["latches"].(map[string]any)["latched_conversations"])
	bad("drop unknown conversation", "DELETE", "/v1/conversations/acme/c1", nil, 404, "not_found")
	bad("wrong method", "GET", "/v1/steering/set", nil, 404, "not_found")
}

// TestServeMetricsMatchStatus parses /metrics and checks it against /v1/status.
func TestServeMetricsMatchStatus(t *testing.T) {
	s := startServe(t, ns(t), "", "--columns", "7")
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "steer", "name": "a", "packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(1)})}})
	s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "r1", "conversation": "c", "override": map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"1": vec(2)}}}})
	cs, err := serve.AttachClient(s.ns, secretFile(t))
	require.NoError(t, err)
	defer cs.Close()
	require.NoError(t, cs.Keys.Set("req-1", []byte("k1")))
	require.NoError(t, cs.Keys.Set("req-2", []byte("k2")))
	require.NoError(t, cs.Keys.Remove("req-2"))

	// The owner reclaims retired blobs in the background, so arena figures may move between two
	// reads: compare metrics with a status read on each side of them that saw the same state.
	var st map[string]any
	var fams map[string]*dto.MetricFamily
	for deadline := time.Now().Add(10 * time.Second); ; {
		before := s.ok("GET", "/v1/status", nil)
		resp, err := http.Get(s.addr + "/metrics")
		require.NoError(t, err)
		var p expfmt.TextParser
		fams, err = p.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		st = s.ok("GET", "/v1/status", nil)
		if before["arena_bytes_free"] == st["arena_bytes_free"] && before["version"] == st["version"] {
			break
		}
		require.True(t, time.Now().Before(deadline), "the region never stood still between a status and a metrics read")
		time.Sleep(10 * time.Millisecond)
	}
	for name, f := range fams {
		require.NotEmpty(t, f.GetHelp(), "%s has no HELP", name)
	}
	value := func(name string) float64 {
		f, ok := fams[name]
		require.True(t, ok, "missing %s", name)
		m := f.GetMetric()[0]
		if m.Gauge != nil {
			return m.Gauge.GetValue()
		}
		return m.Counter.GetValue()
	}
	for metric, field := range map[string]string{
		"shmsteer_latched_conversations": "latched_conversations", "shmsteer_latched_bytes": "latched_bytes",
		"shmsteer_latch_triggers_total": "triggers", "shmsteer_latch_bridges_total": "bridges",
		"shmsteer_latch_evictions_total": "evictions", "shmsteer_latch_oversize_refusals_total": "oversize_refusals",
		"shmsteer_named_vectors": "named_vectors", "shmsteer_keys_live": "keys_live", "shmsteer_keys_revoked": "keys_revoked",
		"shmsteer_arena_used_bytes": "arena_bytes_used", "shmsteer_arena_free_bytes": "arena_bytes_free",
		"shmsteer_index_used_slots": "index_used", "shmsteer_index_free_slots": "index_free",
		"shmsteer_columns": "columns", "shmsteer_columns_used": "columns_used", "shmsteer_columns_retired": "columns_retired",
		"shmsteer_columns_fallbacks_total": "columns_fallbacks", "shmsteer_attached_clients": "attached_clients",
		"shmsteer_region_version": "version",
	} {
		require.Equal(t, st[field], value(metric), "%s vs status %s", metric, field)
	}
	require.EqualValues(t, 1, value("shmsteer_keys_live"))
	require.EqualValues(t, 1, value("shmsteer_keys_revoked"))
	require.EqualValues(t, 1, value("shmsteer_attached_clients"))
	require.EqualValues(t, 7, value("shmsteer_columns"), "serve's --columns sizes the region's pool")

	// Workers' determinism checksums reach /v1/steering/dynamic.
	dyn := s.ok("GET", "/v1/steering/dynamic", nil)
	require.Empty(t, dyn["workers"])
	require.Equal(t, map[string]any{"consistent": true, "action_count": 0.0}, dyn["determinism"])
	require.NoError(t, serve.ReportChecksum(cs.Client, "rank0", 7, 0xabc))
	require.NoError(t, serve.ReportChecksum(cs.Client, "rank1", 7, 0xabc))
	dyn = s.ok("GET", "/v1/steering/dynamic", nil)
	require.Len(t, dyn["workers"], 2)
	require.Equal(t, map[string]any{"consistent": true, "action_count": 7.0}, dyn["determinism"])
	require.NoError(t, serve.ReportChecksum(cs.Client, "rank1", 8, 0xdef))
	require.NoError(t, serve.ReportChecksum(cs.Client, "rank0", 8, 0x123))
	dyn = s.ok("GET", "/v1/steering/dynamic", nil)
	require.Equal(t, map[string]any{"consistent": false, "checksums": map[string]any{"rank0": "0000000000000123", "rank1": "0000000000000def"}}, dyn["determinism"])
	w0 := dyn["workers"].([]any)[0].(map[string]any)
	require.Equal(t, "rank0", w0["worker"])
	require.Equal(t, "0000000000000123", w0["checksum"])
	require.Equal(t, "0000000000000123", w0["action_checksum"])
	require.Error(t, serve.ReportChecksum(cs.Client, "", 1, 1))
	require.Contains(t, fams, "shmsteer_http_request_duration_seconds")
	require.Contains(t, fams, "shmsteer_rpc_duration_seconds")
	require.Contains(t, fams, "shmsteer_oldest_reader_pin_age_seconds")
}

// TestServeColumnsFull: with --columns 1, a second request with its own vectors finds the
// pool full; /v1/status's columns_fallbacks and the counter shmsteer_columns_fallbacks_total
// count it, as does a client's shmsteer status, and serve logs one warning saying to raise
// --columns (a third within the minute counts and does not warn again).
func TestServeColumnsFull(t *testing.T) {
	s := startServe(t, ns(t), "", "--columns", "1")
	admit := func(id string, seed uint64) {
		s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": id, "override": map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"1": vec(seed)}}}})
	}
	admit("r1", 1)
	require.EqualValues(t, 0, s.ok("GET", "/v1/status", nil)["columns_fallbacks"], "r1 took the pool's one column")
	require.Zero(t, s.metrics()["shmsteer_columns_fallbacks_total"].value)
	admit("r2", 2)
	require.EqualValues(t, 1, s.ok("GET", "/v1/status", nil)["columns_fallbacks"])
	require.EqualValues(t, 1, s.metrics()["shmsteer_columns_fallbacks_total"].value)
	admit("r3", 3)
	require.EqualValues(t, 2, s.ok("GET", "/v1/status", nil)["columns_fallbacks"])
	require.EqualValues(t, 2, s.metrics()["shmsteer_columns_fallbacks_total"].value)
	// A client reads the owner's count from the region (shmsteer status attaches as one).
	cmd := exec.Command(binPath, "status", "--json", "--namespace", s.ns)
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Contains(t, string(out), `"columns_fallbacks": 2`)
	require.NoError(t, s.stop(syscall.SIGTERM))
	log := s.stderr.String()
	require.Equal(t, 1, strings.Count(log, "column pool full"), "one warning within the minute:\n%s", log)
	require.Contains(t, log, "raise --columns")
	require.Contains(t, log, "columns_fallbacks=1")
}

// TestCLIClientCommands runs the client commands against a live serve.
func TestCLIClientCommands(t *testing.T) {
	s := startServe(t, ns(t), "")
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "steer", "name": "calm", "packed": map[string]any{"pre_attn": packed("float32", []int{1}, [][]float32{vec(1)})}})
	cs, err := serve.AttachClient(s.ns, secretFile(t))
	require.NoError(t, err)
	require.NoError(t, cs.Keys.Set("req-live", []byte("KEYBYTES-live")))
	require.NoError(t, cs.Keys.Set("req-gone", []byte("KEYBYTES-gone")))
	require.NoError(t, cs.Keys.Remove("req-gone"))
	cs.Close()
	sf := secretFile(t)
	cli := func(env bool, args ...string) (int, string, string) {
		cmd := exec.Command(binPath, append(args, "--namespace", s.ns)...)
		cmd.Env = os.Environ()
		if env {
			cmd.Env = append(cmd.Env, ipc.SecretEnv+"="+e2eSecret)
		} else {
			cmd.Args = append(cmd.Args, "--secret-file", sf)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return code, stdout.String(), stderr.String()
	}
	code, out, _ := cli(true, "status")
	require.Zero(t, code)
	require.Regexp(t, `named_vectors\s+1`, out)
	// Only the owner counts its clients: no -1 where /v1/status has the count.
	require.Regexp(t, `attached_clients\s+unknown to a client \(the owner's count: GET /v1/status`, out)
	code, out, _ = cli(false, "status", "--json")
	require.Zero(t, code)
	require.Contains(t, out, `"keys_live": 1`)
	code, out, _ = cli(true, "keys", "ls")
	require.Zero(t, code)
	require.Regexp(t, `req-live\s+live`, out)
	require.NotContains(t, out, "req-gone")
	require.Contains(t, out, "1 live, 1 revoked")
	require.NotContains(t, out, "KEYBYTES")
	code, _, _ = cli(true, "keys", "rm", "req-live")
	require.Zero(t, code)
	_, out, _ = cli(true, "keys", "ls")
	require.NotContains(t, out, "req-live")
	require.Contains(t, out, "0 live, 2 revoked")
	code, out, _ = cli(true, "vectors", "ls")
	require.Zero(t, code)
	require.Contains(t, out, "calm")
	code, out, _ = cli(false, "vectors", "show", "calm")
	require.Zero(t, code)
	require.Regexp(t, `pre_attn\s+1\s+1\s+`, out)
	code, _, errOut := cli(true, "vectors", "show", "nope")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "unknown named vector")

	// steer global set/clear go through the owner's OpSetGlobal RPC.
	code, out, errOut = cli(true, "steer", "global", "set", "--ref", "calm=0.5")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "global steering set")
	g := s.ok("GET", "/v1/steering", nil)["active_layers"].(map[string]any)
	require.Contains(t, g, "1")
	f := filepath.Join(t.TempDir(), "set.json")
	body, _ := json.Marshal(map[string]any{"decode_vectors": map[string]any{"mlp_out": map[string]any{"3": vec(2)}}})
	require.NoError(t, os.WriteFile(f, body, 0o600))
	code, _, errOut = cli(true, "steer", "global", "set", "--file", f)
	require.Zero(t, code, errOut)
	g = s.ok("GET", "/v1/steering", nil)["active_layers"].(map[string]any)
	require.Contains(t, g, "1", "merge dropped the ref")
	require.Contains(t, g, "3")
	code, _, errOut = cli(true, "steer", "global", "set", "--ref", "nope")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "unknown named vector")
	code, _, _ = cli(true, "steer", "global", "set")
	require.Equal(t, 2, code)
	code, _, _ = cli(true, "steer", "global", "clear")
	require.Zero(t, code)
	require.Empty(t, s.ok("GET", "/v1/steering", nil)["active_layers"])
	code, _, _ = cli(true, "vectors", "rm", "calm")
	require.Zero(t, code)
	require.EqualValues(t, 0, s.ok("GET", "/v1/steering/vectors", nil)["count"])
	code, _, errOut = cli(true, "status", "--secret-file", filepath.Join(t.TempDir(), "none"))
	require.Equal(t, 1, code, errOut)
}

// TestServeSIGTERMAnswersInFlight: a request whose body is still arriving when SIGTERM comes is
// answered, and what it registered is in the persisted state.
func TestServeSIGTERMAnswersInFlight(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir)
	body, _ := json.Marshal(map[string]any{"name": "late", "kind": "steer", "packed": map[string]any{"pre_attn": packed("float32", []int{1}, [][]float32{vec(300)})}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.addr, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/steering/vectors/register HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", adminKey, len(body))
	_, err = conn.Write(body[:len(body)/2])
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	time.Sleep(100 * time.Millisecond)
	_, err = conn.Write(body[len(body)/2:])
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
	select {
	case err := <-s.done:
		require.NoError(t, err, "serve must exit 0:\n%s", s.stderr)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit after SIGTERM")
	}
	s2 := startServe(t, ns(t), dir)
	require.EqualValues(t, 1, s2.ok("GET", "/v1/steering/vectors", nil)["count"])
}
