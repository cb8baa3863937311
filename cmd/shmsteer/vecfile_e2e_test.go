package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/serve"
	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// ggufControlVector writes a llama.cpp control vector byte by byte from the GGUF v3
// specification (independently of package vecfile's writer): header, three metadata keys, one
// F32 tensor "direction.N" of hidden floats per layer N (ascending), data aligned to 32 bytes.
func ggufControlVector(hidden int, dirs map[int][]float32) []byte {
	const typeInt32, typeString, ggmlF32, align = 5, 8, 0, 32
	le := binary.LittleEndian
	str := func(b []byte, s string) []byte { return append(le.AppendUint64(b, uint64(len(s))), s...) }
	var layers []int
	for n := range dirs {
		layers = append(layers, n)
	}
	for i := range layers { // insertion sort: a handful of layers
		for j := i; j > 0 && layers[j] < layers[j-1]; j-- {
			layers[j], layers[j-1] = layers[j-1], layers[j]
		}
	}
	b := le.AppendUint32([]byte("GGUF"), 3)
	b = le.AppendUint64(b, uint64(len(layers)))
	b = le.AppendUint64(b, 3)
	b = le.AppendUint32(str(b, "general.architecture"), typeString)
	b = str(b, "controlvector")
	b = le.AppendUint32(str(b, "controlvector.model_hint"), typeString)
	b = str(b, "llama")
	b = le.AppendUint32(str(b, "controlvector.layer_count"), typeInt32)
	b = le.AppendUint32(b, uint32(len(layers)))
	size := (4*hidden + align - 1) / align * align
	for i, n := range layers {
		b = str(b, "direction."+strconv.Itoa(n))
		b = le.AppendUint32(b, 1)
		b = le.AppendUint64(b, uint64(hidden))
		b = le.AppendUint32(b, ggmlF32)
		b = le.AppendUint64(b, uint64(i*size))
	}
	for len(b)%align != 0 {
		b = append(b, 0)
	}
	for _, n := range layers {
		start := len(b)
		for _, f := range dirs[n] {
			b = le.AppendUint32(b, math.Float32bits(f))
		}
		for len(b)-start < size {
			b = append(b, 0)
		}
	}
	return b
}

// noLength hides a body's length, so the client sends it chunked.
type noLength struct{ r io.Reader }

func (n noLength) Read(p []byte) (int, error) { return n.r.Read(p) }

// raw does a request with a raw body and returns the status, the body and the JSON reply (if
// the reply is JSON).
func (s *served) raw(method, path, key string, body io.Reader) (int, []byte, map[string]any) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.addr+path, body)
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	var m map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(s.t, json.Unmarshal(out, &m), "%s", out)
	}
	return resp.StatusCode, out, m
}

// vectorsState is what must not change when an upload is refused.
func vectorsState(s *served) string {
	b, _ := json.Marshal([]any{s.ok("GET", "/v1/steering/vectors", nil)["vectors"], s.ok("GET", "/v1/status", nil)["version"]})
	return string(b)
}

// TestServeVectorFileUpload: a llama.cpp control vector uploaded to serve is registered with
// the scale and layer range, steers post_block at those layers in a worker, survives a
// restart, and exports to every format with a bitwise round trip; corrupt, mis-shaped,
// oversize and out-of-scope uploads are refused with their status and change nothing.
func TestServeVectorFileUpload(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir, "--max-upload-bytes", "4096")
	dirs := map[int][]float32{1: vec(301), 2: vec(302), 3: vec(303)}
	cv := ggufControlVector(e2eHidden, dirs)

	code, _, m := s.raw("POST", "/v1/steering/vectors/import?name=happy&scale=0.5&layers=1-2&filename=happy.gguf", adminKey, bytes.NewReader(cv))
	require.Equal(t, http.StatusOK, code, "%v", m)
	require.EqualValues(t, 2, m["entries"])
	require.Equal(t, []any{1.0, 2.0}, m["layers"])
	require.Equal(t, []any{"post_block"}, m["hook_points"])
	require.Equal(t, "llama", m["model_hint"], "the GGUF's controlvector.model_hint")
	digest := m["digest"].(string)

	checkUploadSteers(t, s, dirs)
	checkUploadRefusals(t, s, cv)
	// A tenant key may create its own names.
	code, _, m = s.raw("POST", "/v1/steering/vectors/import?name=acme/happy&layers=1-2&scale=0.5", acmeKey, bytes.NewReader(cv))
	require.Equal(t, http.StatusOK, code, "%v", m)
	require.Equal(t, digest, m["digest"])

	checkUploadExports(t, s, cv, dirs, digest)

	// Persisted like other named vectors.
	require.NoError(t, s.stop(syscall.SIGTERM))
	s2 := startServe(t, ns(t), dir)
	found := false
	for _, v := range s2.ok("GET", "/v1/steering/vectors?details=1", nil)["details"].([]any) {
		if v := v.(map[string]any); v["name"] == "happy" {
			found = v["digest"] == digest
		}
	}
	require.True(t, found, "the uploaded vector was not restored")
	// With its model hint: import → restart → export keeps it.
	require.Equal(t, "llama", hintListed(s2, "happy"))
	require.Equal(t, "gemma2", hintListed(s2, "hinted"))
	code, file, m := s2.raw("GET", "/v1/steering/vectors/happy/export?format=gguf", adminKey, nil)
	require.Equal(t, http.StatusOK, code, "%v", m)
	require.Equal(t, "llama", vecfile.ModelHint(file), "the hint after a restart from the state dir")
	cs, err := serve.AttachClient(s2.ns, secretFile(t))
	require.NoError(t, err)
	defer cs.Close()
	var out bytes.Buffer
	require.NoError(t, cs.VectorShow(&out, "happy"))
	require.Contains(t, out.String(), "post_block", fmt.Sprint(out.String()))
}

// hintListed is the model hint GET /v1/steering/vectors lists for steering vector name.
func hintListed(s *served, name string) string {
	for _, v := range s.ok("GET", "/v1/steering/vectors?details=1", nil)["details"].([]any) {
		if v := v.(map[string]any); v["name"] == name && v["kind"] == "steer" {
			h, _ := v["model_hint"].(string)
			return h
		}
	}
	return "<not listed>"
}

// checkUploadSteers checks that the uploaded "happy" (dirs at 0.5, layers 1-2), set as the
// global steering at strength 1, makes a worker add 0.5*direction.N to post_block at layers 1
// and 2, and nothing at layer 3 or at another hook; it clears the global steering after.
func checkUploadSteers(t *testing.T, s *served, dirs map[int][]float32) {
	t.Helper()
	s.ok("POST", "/v1/steering/set", map[string]any{"vector_refs": map[string]any{"happy": 1}})
	sec := ipc.NewSecret([]byte(e2eSecret))
	c, err := ipc.Attach(ipc.ClientOptions{Secret: &sec, Namespace: s.ns})
	require.NoError(t, err)
	eng, err := steer.Attach(c.Region(), nil, steer.Options{Caller: c})
	require.NoError(t, err)
	st := eng.NewStepper()
	apply := func(hook string, layer int) []float32 {
		id, err := eng.Config().Hook(hook)
		require.NoError(t, err)
		h := make([]float32, e2eHidden)
		require.NoError(t, st.Begin(0))
		require.NoError(t, st.Apply(id, layer, h, []steer.Span{{ID: "any", Start: 0, End: 1, Phase: steer.PhaseDecode}}))
		st.End()
		return h
	}
	for layer := range e2eLayers {
		h := apply("post_block", layer)
		for i := range e2eHidden {
			want := float32(0)
			if layer == 1 || layer == 2 {
				want = 0.5 * dirs[layer][i]
			}
			require.InDelta(t, want, h[i], 1e-6, "post_block layer %d", layer)
		}
	}
	require.Equal(t, make([]float32, e2eHidden), apply("mlp_out", 1))
	st.Close()
	c.Close()
	s.ok("POST", "/v1/steering/clear", nil)
}

// checkUploadRefusals checks that corrupt, mis-shaped, oversize and out-of-scope uploads (cv is
// a valid one) are refused with their status and change nothing.
func checkUploadRefusals(t *testing.T, s *served, cv []byte) {
	t.Helper()
	before := vectorsState(s)
	big := make([]byte, 5000)
	copy(big, cv)
	shortDir := ggufControlVector(e2eHidden-1, map[int][]float32{1: vec(1)[:e2eHidden-1]})
	for _, tc := range []struct {
		name, query, key string
		body             io.Reader
		code             int
		typ, says        string
	}{
		{"truncated", "name=bad&filename=cut.gguf", adminKey, bytes.NewReader(cv[:len(cv)-9]), 422, "corrupt_file", "cut.gguf"},
		{"garbage", "name=bad&filename=x.bin", adminKey, strings.NewReader("not a vector file at all"), 400, "unknown_format", "x.bin"},
		{"hidden size", "name=bad&filename=short.gguf", adminKey, bytes.NewReader(shortDir), 422, "shape", "direction.1"},
		{"oversize", "name=bad", adminKey, bytes.NewReader(big), 413, "too_large", "4096"},
		{"oversize chunked", "name=bad", adminKey, noLength{bytes.NewReader(big)}, 413, "too_large", "4096"},
		{"layer range", "name=bad&layers=3-1", adminKey, bytes.NewReader(cv), 400, "bad_options", "3-1"},
		{"scale", "name=bad&scale=inf", adminKey, bytes.NewReader(cv), 400, "bad_request", "scale"},
		{"unknown hook", "name=bad&hook=nope", adminKey, bytes.NewReader(cv), 400, "unknown_hook", "nope"},
		{"format", "name=bad&format=pickle", adminKey, bytes.NewReader(cv), 400, "unknown_format", "pickle"},
		{"no name", "filename=a.gguf", adminKey, bytes.NewReader(cv), 400, "bad_request", "name"},
		{"unknown param", "name=bad&file=a", adminKey, bytes.NewReader(cv), 400, "bad_request", "file"},
		{"model hint", "name=happy&model_hint=two%0Alines", adminKey, bytes.NewReader(cv), 400, "bad_model_hint", "non-printable"},
		{"tenant scope", "name=bad", acmeKey, bytes.NewReader(cv), 403, "forbidden", "acme/"},
		{"no key", "name=bad", "", bytes.NewReader(cv), 401, "unauthorized", ""},
	} {
		code, _, m := s.raw("POST", "/v1/steering/vectors/import?"+tc.query, tc.key, tc.body)
		require.Equal(t, tc.code, code, "%s: %v", tc.name, m)
		require.Equal(t, tc.typ, m["type"], "%s: %v", tc.name, m)
		require.Contains(t, m["error"], tc.says, tc.name)
		require.Equal(t, before, vectorsState(s), "%s changed the state", tc.name)
	}
}

// checkUploadExports checks the exports of "happy" (dirs at 0.5, layers 1-2, digest): every
// format reimports bitwise, the model hint goes with the vector, and bad export paths fail.
func checkUploadExports(t *testing.T, s *served, cv []byte, dirs map[int][]float32, digest string) {
	t.Helper()
	// Export: every format reimports to the same digest (bitwise), and the GGUF export holds
	// exactly 0.5*direction.N for N in 1..2.
	for _, f := range []string{"gguf", "npy", "npz", "safetensors"} {
		code, file, m := s.raw("GET", "/v1/steering/vectors/happy/export?format="+f, adminKey, nil)
		require.Equal(t, http.StatusOK, code, "%s: %v", f, m)
		code, _, m = s.raw("POST", "/v1/steering/vectors/import?name=rt-"+f+"&format="+f, adminKey, bytes.NewReader(file))
		require.Equal(t, http.StatusOK, code, "%s: %v", f, m)
		require.Equal(t, digest, m["digest"], "%s round trip is not bitwise", f)
		if f == "gguf" {
			vecs, err := vecfile.ImportBytes(file, "export.gguf", steer.ModelConfig{Hidden: e2eHidden, Layers: e2eLayers}, vecfile.ImportOptions{})
			require.NoError(t, err)
			require.Len(t, vecs, 2)
			for _, v := range vecs {
				for i, x := range v.Data {
					require.Equal(t, math.Float32bits(0.5*dirs[v.Layer][i]), math.Float32bits(x))
				}
			}
		}
	}
	// The hint is stored with the vector: listed, and written back by a GGUF export unless
	// model_hint= gives another ("" for none); an import of that file stores that one.
	require.Equal(t, "llama", hintListed(s, "happy"))
	for q, want := range map[string]string{"": "llama", "&model_hint=qwen2": "qwen2", "&model_hint=": ""} {
		code, file, m := s.raw("GET", "/v1/steering/vectors/happy/export?format=gguf"+q, adminKey, nil)
		require.Equal(t, http.StatusOK, code, "%v", m)
		require.Equal(t, want, vecfile.ModelHint(file), "export%s", q)
		code, _, m = s.raw("POST", "/v1/steering/vectors/import?name=hinted", adminKey, bytes.NewReader(file))
		require.Equal(t, http.StatusOK, code, "%v", m)
		require.Equal(t, want, m["model_hint"])
		require.Equal(t, want, hintListed(s, "hinted"))
	}
	code, _, m := s.raw("POST", "/v1/steering/vectors/import?name=hinted&model_hint=gemma2", adminKey, bytes.NewReader(cv))
	require.Equal(t, http.StatusOK, code, "%v", m)
	require.Equal(t, "gemma2", hintListed(s, "hinted"), "model_hint= replaces the file's")
	code, _, m = s.raw("GET", "/v1/steering/vectors/acme/happy/export", acmeKey, nil)
	require.Equal(t, http.StatusOK, code, "%v", m)
	code, _, m = s.raw("GET", "/v1/steering/vectors/acme%2Fhappy/export?format=npz", acmeKey, nil)
	require.Equal(t, http.StatusOK, code, "%v", m)
	for _, tc := range []struct {
		path, key string
		code      int
	}{
		{"/v1/steering/vectors/happy/export", acmeKey, 404}, // another tenant's name
		{"/v1/steering/vectors/nope/export", adminKey, 404},
		{"/v1/steering/vectors/happy/export?format=xml", adminKey, 400},
		{"/v1/steering/vectors/happy/export?fmt=npy", adminKey, 400},
		{"/v1/steering/vectors/happy/other", adminKey, 404},
	} {
		code, _, m := s.raw("GET", tc.path, tc.key, nil)
		require.Equal(t, tc.code, code, "%s: %v", tc.path, m)
	}
}
