package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/serve"
	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
	"github.com/stretchr/testify/require"
)

// TestCLIVectorFiles: `shmsteer vectors import` registers a llama.cpp control vector with
// llama.cpp's scale and layer-range semantics, `vectors export` writes it back losslessly, and
// bad input is refused with the exit code and a message that names the problem.
func TestCLIVectorFiles(t *testing.T) {
	s := startServe(t, ns(t), "")
	cfg := steer.ModelConfig{Hidden: e2eHidden, Layers: e2eLayers}
	dir := t.TempDir()
	var src []steer.Vector
	for l := 1; l < e2eLayers; l++ {
		src = append(src, steer.Vector{Hook: "post_block", Layer: l, Scale: 1, Data: vec(uint64(20 + l))})
	}
	gguf := filepath.Join(dir, "happy.gguf")
	require.NoError(t, vecfile.ExportFile(gguf, vecfile.FormatGGUF, cfg, src, vecfile.ExportOptions{ModelHint: "llama"}))
	cli := func(args ...string) (int, string, string) { return runCLIIn(s.ns, args...) }

	code, out, errOut := cli("vectors", "import", gguf, "--name", "happy", "--scale", "0.5", "--layers", "1-2")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "registered happy: 2 vectors")
	require.Contains(t, out, `model hint "llama" stored with it (GGUF controlvector.model_hint; export writes it back)`)
	want := checkImportedHappy(t, s, src)

	for _, ext := range []string{"npy", "npz", "safetensors", "gguf"} {
		out := filepath.Join(dir, "back."+ext)
		code, _, errOut = cli("vectors", "export", "happy", out)
		require.Zero(t, code, errOut)
		got, err := vecfile.Import(out, cfg, vecfile.ImportOptions{})
		require.NoError(t, err, ext)
		require.Len(t, got, 2, ext)
		for i, v := range got {
			require.Equal(t, want[i], v.Data, "%s round trip is bitwise", ext)
		}
	}

	// The hint is stored with the vector: export writes it back; --model-hint replaces it.
	b, err := os.ReadFile(filepath.Join(dir, "back.gguf"))
	require.NoError(t, err)
	require.Equal(t, "llama", vecfile.ModelHint(b), "the stored hint, without --model-hint")
	for hint, want := range map[string]string{"qwen2": "qwen2", "": ""} {
		hinted := filepath.Join(dir, "hinted.gguf")
		code, _, errOut = cli("vectors", "export", "happy", hinted, "--model-hint", hint)
		require.Zero(t, code, errOut)
		b, err := os.ReadFile(hinted)
		require.NoError(t, err)
		require.Equal(t, want, vecfile.ModelHint(b), "--model-hint %q", hint)
	}
	code, out, _ = cli("vectors", "ls")
	require.Zero(t, code)
	require.Regexp(t, `(?m)^happy +steer +2 .* llama$`, out)
	code, out, _ = cli("vectors", "show", "happy")
	require.Zero(t, code)
	require.Contains(t, out, "model_hint llama\n")
	code, _, errOut = cli("vectors", "import", gguf, "--name", "badhint", "--model-hint", "two\nlines")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "bad model hint")

	corrupt := filepath.Join(dir, "bad.gguf")
	b, err = os.ReadFile(gguf)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(corrupt, b[:len(b)/2], 0o600))
	for _, tt := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"vectors", "import", corrupt, "--name", "x"}, 1, "bad.gguf"},
		{[]string{"vectors", "import", gguf, "--name", "x", "--scale", "0"}, 1, "--scale 0"},
		{[]string{"vectors", "import", gguf, "--name", "x", "--layers", "3-1"}, 1, "layer range"},
		{[]string{"vectors", "import", gguf}, 2, "--name is required"},
		{[]string{"vectors", "export", "nope", filepath.Join(dir, "n.npy")}, 1, "unknown named vector"},
	} {
		code, _, errOut := cli(tt.args...)
		require.Equal(t, tt.code, code, "%v: %s", tt.args, errOut)
		require.Contains(t, errOut, tt.msg, "%v", tt.args)
	}
	require.EqualValues(t, 1, s.ok("GET", "/v1/steering/vectors", nil)["count"], "refused imports changed nothing")
}

// runCLIIn runs the shmsteer binary with args in namespace ns (with the e2e secret): its exit
// code, stdout and stderr.
func runCLIIn(ns string, args ...string) (int, string, string) {
	cmd := exec.Command(binPath, append(args, "--namespace", ns)...)
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	return 0, stdout.String(), stderr.String()
}

// checkImportedHappy checks the vector "happy" imported from src with --scale 0.5 --layers 1-2
// (layers 1 and 2 of post_block, scaled) and returns its rows.
func checkImportedHappy(t *testing.T, s *served, src []steer.Vector) [][]float32 {
	t.Helper()
	cs, err := serve.AttachClient(s.ns, secretFile(t))
	require.NoError(t, err)
	defer cs.Close()
	snap, err := cs.Engine.Region().Snapshot()
	require.NoError(t, err)
	nv, err := cs.Engine.Vector(&snap, "happy")
	require.NoError(t, err)
	require.Len(t, nv.Vectors, 2)
	for i, v := range nv.Vectors {
		require.Equal(t, "post_block", v.Hook)
		require.Equal(t, i+1, v.Layer, "layers 1-2 only")
		for j, f := range v.Data {
			require.Equal(t, 0.5*src[i].Data[j], f, "scaled as llama.cpp does at load")
		}
	}
	want := make([][]float32, len(nv.Vectors))
	for i, v := range nv.Vectors {
		want[i] = append([]float32(nil), v.Data...)
	}
	snap.Close()
	return want
}
