package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBenchSmoke runs a tiny pass of `shmsteer bench` with the engine contenders: keys read
// and written by attached child processes, the owner's Set, the 2-reader scaling, the step
// figures and the memory figures, and checks the JSON records.
func TestBenchSmoke(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.json")
	var stdout, stderr bytes.Buffer
	err := Main(Options{Quick: true, Rounds: 1, JSON: out,
		Only: "keys.get.shmsteer,keys.set.client,keys.set.owner,keys.get.gomap,keys.get.throughput,keys.get.cold,steer.,mem.,kernels.add.16k"},
		&stdout, &stderr)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var recs []figure
	require.NoError(t, json.Unmarshal(raw, &recs))
	got := map[string]figure{}
	for _, r := range recs {
		got[r.Name] = r
	}
	for _, name := range []string{"keys.get.shmsteer_ns", "keys.set.client_ns", "keys.set.owner_ns", "keys.set.owner_p99_ns",
		"keys.get.gomap_ns", "keys.get.throughput_2readers_x", "keys.get.throughput_2gomaps_x",
		"steer.step.prefill.mixed_ns", "steer.step.prefill.kernel_ns", "steer.step.decode.mixed_ns", "steer.step.decode.kernel_ns",
		"steer.step.decode.scattered_kernel_ns",
		"steer.step.decode.sparse_ns", "steer.step.decode.sparse_kernel_ns",
		"steer.step.decode.mixed_apply_ns", "steer.step.decode.sparse_apply_ns",
		"mem.overhead_ratio", "mem.tp8_ratio", "kernels.add.16k.shmsteer_ns", "kernels.add.16k.goloop_ns"} {
		require.Contains(t, got, name, stdout.String())
		require.Greater(t, got[name].Value, 0.0, name)
	}
	for _, pair := range [][2]string{{"steer.step.prefill.mixed_ns", "steer.step.prefill.kernel_ns"},
		{"steer.step.decode.mixed_ns", "steer.step.decode.kernel_ns"},
		{"steer.step.decode.scattered_kernel_ns", "steer.step.decode.kernel_ns"}, {"steer.step.decode.sparse_ns", "steer.step.decode.sparse_kernel_ns"},
		{"steer.step.decode.mixed_apply_ns", "steer.step.decode.kernel_ns"}, {"steer.step.decode.sparse_apply_ns", "steer.step.decode.sparse_kernel_ns"}} {
		require.Equal(t, pair[1], got[pair[0]].Baseline)
		require.InDelta(t, got[pair[0]].Value/got[pair[1]].Value, got[pair[0]].Ratio, 1e-9)
	}
	require.NotContains(t, got, "keys.get.scaling_2readers", "replaced by the throughput figures")
	// --quick leaves out the 1M-key region and says so.
	require.Contains(t, stdout.String(), "skipped keys.get.cold.shmsteer_ns: skipped in --quick")
	require.Contains(t, got["mem.tp8_ratio"].Note, "rank processes attached")
}
