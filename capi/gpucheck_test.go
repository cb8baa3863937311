//go:build cgo

package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGPUCheckCPU runs python/benchmarks/gpu_check.py --quick as CI can: on CPU tensors when
// the interpreter's torch sees no CUDA device (each section then runs on the CPU, static mode's
// CUDA graph is "not run"), on the GPU when it does. The check exits non-zero only when a result
// differed from its reference; every section must be in the report with a status it may have
// on this machine. On a GPU machine run it in full:
//
//	PYTHONPATH=python python python/benchmarks/gpu_check.py --out report.md
func TestGPUCheckCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the GPU check on CPU tensors runs in the full go test ./...")
	}
	py := pythonForTests(t)
	buildLibrary(t)
	pyDir, err := filepath.Abs(filepath.Join("..", "python"))
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "report.md")
	cmd := exec.Command(py, filepath.Join(pyDir, "benchmarks", "gpu_check.py"), "--quick", "--out", out)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pyDir, "PYTHONDONTWRITEBYTECODE=1")
	start := time.Now()
	log, err := cmd.CombinedOutput()
	t.Logf("gpu_check.py --quick: %s\n%s", time.Since(start).Round(time.Second), log)
	require.NoError(t, err, "gpu_check.py failed (its report is above)")

	raw, err := os.ReadFile(filepath.Join(filepath.Dir(out), "report.json"))
	require.NoError(t, err)
	var rep struct {
		Environment struct {
			Device string `json:"device"`
		} `json:"environment"`
		Sections []struct {
			Key    string   `json:"key"`
			Status string   `json:"status"`
			Lines  []string `json:"lines"`
		} `json:"sections"`
	}
	require.NoError(t, json.Unmarshal(raw, &rep))
	cuda := rep.Environment.Device != "cpu"
	allowed := map[string][]string{
		"cuda_tests":   {"pass", "skipped"}, // skipped: every CUDA test skips without a device
		"device_step":  {"pass"},
		"static_graph": {"pass"},
		"compile":      {"pass"},
		"hf":           {"pass", "not available"}, // shmsteer.hf or transformers missing
	}
	if _, err := os.Stat(filepath.Join(pyDir, "shmsteer", "hf.py")); err == nil {
		allowed["hf"] = []string{"pass"} // the checkout has shmsteer.hf, and TestPython's venv has transformers
	}
	if !cuda {
		allowed["static_graph"] = []string{"not run"}
		allowed["cuda_tests"] = []string{"skipped"}
	}
	var keys []string
	for _, s := range rep.Sections {
		keys = append(keys, s.Key)
		require.Contains(t, allowed[s.Key], s.Status, "section %s: %v", s.Key, s.Lines)
	}
	require.Equal(t, []string{"cuda_tests", "device_step", "static_graph", "compile", "hf"}, keys)
}
