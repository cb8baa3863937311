package bench

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func runOf(figs ...figure) []figure { return figs }

func TestSummarize(t *testing.T) {
	hot := func(r float64) figure {
		return figure{Name: "keys.get.shmsteer_ns", Value: 40, Unit: "ns/op", Baseline: "keys.get.gomap_ns", Ratio: r, RatioPaired: true}
	}
	p99 := func(v float64) figure { return figure{Name: "keys.set.owner_p99_ns", Value: v, Unit: "ns/op"} }
	py := func(v float64) figure { return figure{Name: "keys.get.python_ns", Value: v, Unit: "ns/op"} }
	runs := [][]figure{
		runOf(hot(1.4), p99(2500), figure{Name: "mem.tp8_ratio", Value: 0.2, Unit: "x"}),
		runOf(hot(1.6), p99(3500), py(47.8)),
		runOf(hot(1.45), p99(2900), py(46.2)),
	}
	var out bytes.Buffer
	require.NoError(t, summarize(&out, runs))
	got := out.String()
	require.Contains(t, got, "| key Get from a worker ≤ 1.5× a Go map (hot) | 1.400, 1.600, 1.450 | 1.450 | 2 of 3 |")
	require.Contains(t, got, "| owner Set p99 ≤ 3 µs | 2.50 µs, 3.50 µs, 2.90 µs | 2.90 µs | 2 of 3 |")
	require.Contains(t, got, "| 8 real ranks hold ≤ 0.15× the bytes of 8 private copies | 0.200×, —, — | 0.200× | 0 of 1 |")
	require.Contains(t, got, "| decode step ≤ 1.05× its kernel | —, —, — | — | 0 of 0 |", "a goal no run measured")
	require.Contains(t, got, "| Python key Get ≤ 500 ns | —, 47.8 ns, 46.2 ns | 47.0 ns | 2 of 2 |", "the median in the unit of a run that has it")
	require.Contains(t, got, "| `keys.get.shmsteer_ns` | 40.0 ns | 40.0 ns, 40.0 ns, 40.0 ns | `keys.get.gomap_ns` | 1.450 |")
	require.Less(t, strings.Index(got, "`keys.get.shmsteer_ns`"), strings.Index(got, "`keys.set.owner_p99_ns`"), "report order")

	require.ErrorIs(t, summarize(&out, nil), ErrUsage)
}

func TestReadRun(t *testing.T) {
	good := []figure{{Name: "keys.get.shmsteer_ns", Value: 40, Unit: "ns/op", Baseline: "keys.get.gomap_ns", Ratio: 1.2}}
	b, err := json.Marshal(good)
	require.NoError(t, err)
	figs, err := readRun(bytes.NewReader(b))
	require.NoError(t, err)
	require.Equal(t, good[0].Ratio, figs[0].Ratio)

	for name, in := range map[string]string{
		"not json":       "# shmsteer bench: 11 rounds",
		"object":         `{"name": "x", "value": 1}`,
		"null":           `null`,
		"no name":        `[{"value": 1}]`,
		"ratio, no base": `[{"name": "x", "value": 1, "ratio": 2}]`,
		"overflow":       `[{"name": "x", "value": 1e999}]`,
	} {
		_, err := readRun(strings.NewReader(in))
		require.ErrorIs(t, err, ErrBadRun, name)
	}
}

// The --summarize flag reads the files --json wrote.
func TestSummarizeFiles(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for i, r := range []float64{1.1, 1.2} {
		rep := report{Figures: []figure{{Name: "steer.step.prefill.mixed_ns", Value: 100 * r, Unit: "ns/op"}, {Name: "steer.step.prefill.kernel_ns", Value: 100, Unit: "ns/op"}}}
		rep.Finish()
		name := filepath.Join(dir, "run"+string(rune('1'+i))+".json")
		require.NoError(t, writeFile(name, rep.WriteJSON))
		files = append(files, name)
	}
	var out, errb bytes.Buffer
	require.NoError(t, runMain(Options{Summarize: strings.Join(files, ",")}, sources{}, &out, &errb))
	require.Contains(t, out.String(), "| prefill step ≤ 1.05× its kernel | 1.100, 1.200 | 1.150 | 0 of 2 |")

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte("{}"), 0o644))
	err := runMain(Options{Summarize: files[0] + "," + bad}, sources{}, &out, &errb)
	require.ErrorIs(t, err, ErrBadRun)
	require.ErrorContains(t, err, "bad.json")
	require.True(t, strings.HasPrefix(err.Error(), "shmsteer: "), "one prefix, first: %v", err)

	missing := filepath.Join(dir, "missing.json")
	err = runMain(Options{Summarize: files[0] + "," + missing}, sources{}, &out, &errb)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, "missing.json")
}

// FuzzReadRun: any bytes are a run or ErrBadRun, and a run summarizes.
func FuzzReadRun(f *testing.F) {
	f.Add([]byte(`[{"name": "keys.get.shmsteer_ns", "value": 40, "unit": "ns/op", "baseline": "keys.get.gomap_ns", "ratio": 1.2}]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`[{"name": "mem.tp8_ratio", "value": -1}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		figs, err := readRun(bytes.NewReader(b))
		if err != nil {
			require.ErrorIs(t, err, ErrBadRun)
			return
		}
		require.NoError(t, summarize(&bytes.Buffer{}, [][]figure{figs, figs}))
	})
}
