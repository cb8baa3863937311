package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// testRoles are child roles only the tests use.
var testRoles = map[string]ChildFunc{
	"test.fail": func([]string) (map[string]Op, func() error, error) {
		return nil, nil, errors.New("setup refused")
	},
	"test.echo": func(args []string) (map[string]Op, func() error, error) {
		return map[string]Op{
			// Sleeps n milliseconds: for aligned starts, where the parent gets
			// the time from the start instant.
			"sleep": func(n int) (time.Duration, error) {
				time.Sleep(time.Duration(n) * time.Millisecond)
				return time.Duration(n) * time.Millisecond, nil
			},
			// Reports n microseconds, so the parent sees the child's own
			// timing, not the pipe round trip.
			"us": func(n int) (time.Duration, error) { return time.Duration(n) * time.Microsecond, nil },
			"fail": func(int) (time.Duration, error) {
				return 0, errors.New("op failed: " + strings.Join(args, " "))
			},
		}, nil, nil
	},
}

func TestMain(m *testing.M) {
	RunChildIfRequested(testRoles)
	os.Exit(m.Run())
}

// tiny is a config for smoke tests: enough to exercise every path, too short
// to mean anything.
func tiny() runConfig { return runConfig{Rounds: 3, Target: 200 * time.Microsecond} }

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float64
		want float64
	}{
		{"empty", nil, 0},
		{"one", []float64{7}, 7},
		{"odd unsorted", []float64{5, 1, 3}, 3},
		{"even", []float64{4, 1, 3, 2}, 2.5},
		{"outlier", []float64{10, 11, 1000, 12, 9}, 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.in...)
			require.Equal(t, tc.want, median(tc.in))
			require.Equal(t, in, tc.in, "median must not reorder its input")
		})
	}
}

func TestQuantile(t *testing.T) {
	for _, tc := range []struct {
		in      []float64
		q, want float64
	}{
		{nil, 0.5, 0},
		{[]float64{3}, 0.25, 3},
		{[]float64{4, 1, 3, 2, 5}, 0.25, 2},
		{[]float64{4, 1, 3, 2, 5}, 0.75, 4},
		{[]float64{1, 2}, 0.5, 1.5},
		{[]float64{1, 2}, 1, 2},
	} {
		require.Equal(t, tc.want, quantile(tc.in, tc.q), "%v q=%v", tc.in, tc.q)
	}
}

func TestCalibrateReachesTarget(t *testing.T) {
	var calls []int
	op := func(n int) (time.Duration, error) {
		calls = append(calls, n)
		return time.Duration(n) * 300 * time.Nanosecond, nil
	}
	n, err := calibrate(op, time.Millisecond)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Duration(n)*300, time.Millisecond)
	require.Less(t, len(calls), 6, "calibration should converge in a few batches: %v", calls)
}

func TestAlternateOrderAndSkips(t *testing.T) {
	var order []string
	mk := func(name string) setupFunc {
		return func() (Op, func() error, error) {
			return func(n int) (time.Duration, error) {
				order = append(order, name)
				return time.Duration(n) * time.Millisecond, nil
			}, nil, nil
		}
	}
	cleaned := false
	figs, warns := alternateAll(runConfig{Rounds: 2, Target: time.Millisecond},
		contender{"a_ns", mk("a")},
		contender{"broken_ns", func() (Op, func() error, error) {
			return nil, func() error { cleaned = true; return errors.New("boom") }, errors.New("no such thing")
		}},
		contender{"panics_ns", func() (Op, func() error, error) { panic("half-written hook") }},
		contender{"nil_ns", nil},
		contender{"b_ns", mk("b")},
	)
	// One calibration batch each, then rounds alternate a b a b.
	require.Equal(t, []string{"a", "b", "a", "b", "a", "b"}, order)
	require.Len(t, figs, 5)
	require.Equal(t, 1e6, figs[0].Value)
	require.Equal(t, "ns/op", figs[0].Unit)
	require.Equal(t, "no such thing", figs[1].Skipped)
	require.Contains(t, figs[2].Skipped, "half-written hook")
	require.Equal(t, ErrNotWired.Error(), figs[3].Skipped)
	require.True(t, cleaned, "cleanup of a failed setup must still run")
	require.Len(t, warns, 1)
	require.Contains(t, warns[0], "boom")
}

// fakeSources wires every hook with something cheap, so the smoke run walks
// every path of runFigures without the engine.
func fakeSources() sources {
	owner := func() (Op, func() error, error) { return gomapOp(), nil, nil }
	return sources{
		KeysGet: owner,
		KeysSetOwner: func() (func([]time.Duration) error, func() error, error) {
			return func(lat []time.Duration) error {
				for i := range lat {
					lat[i] = time.Duration(100+i%100) * time.Nanosecond // p50 ~150, p99 199
				}
				return nil
			}, nil, nil
		},
		// KeysSetClient stays nil: reported as not wired.
		KeysReaderProcs: gomapProcs,
		AddRows:         repeated(goLoopAdd),
		AddRowsC: func(variant string, h []float32, d int, s float32, v []float32, iters int) error {
			if len(h) > d {
				return errors.New("only 16k here")
			}
			if variant == "slow" {
				iters *= 20 // far enough from "fast" that noise cannot swap them
			}
			for range iters {
				goLoopAdd(h, d, s, v)
			}
			return nil
		},
		CVariants: []string{"slow", "fast"},
		StepMixed: func() (Op, func() error, error) { panic("not yet") },
		Memory:    func() (float64, error) { return 1.25, nil },
		TP8:       func() (float64, string, error) { return 0.125, "8 fake ranks", nil },
	}
}

func TestSmokeReport(t *testing.T) {
	cfg := tiny()
	// Everything but the Python and Redis baselines, which have their own
	// tests.
	cfg.Only = []string{"keys.get.gomap", "keys.get.shmsteer", "keys.set.owner", "keys.set.client",
		"keys.get.throughput_2readers", "kernels.add.16k.goloop", "kernels.add.16k.shmsteer", "kernels.add.16k.c",
		"kernels.add.256k.c", "steer.", "mem."}
	var prog bytes.Buffer
	cfg.Progress = &prog
	rep := runFigures(cfg, fakeSources())
	require.Contains(t, prog.String(), "keys.get.gomap_ns")

	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	out := table.String()
	for _, want := range []string{
		"keys.get.gomap_ns", "keys.get.shmsteer_ns", "kernels.add.16k.goloop_ns",
		"kernels.add.16k.c_ns", "mem.overhead_ratio",
		"skipped keys.set.client_ns: " + ErrNotWired.Error(),
		"skipped kernels.add.256k.c_ns: only 16k here",
		"skipped steer.step.prefill.mixed_ns: setup panicked: not yet",
		"note kernels.add.16k.c_ns: working set 32 KiB; best gcc -O3 -march=native variant: fast",
	} {
		require.Contains(t, out, want)
	}

	var js bytes.Buffer
	require.NoError(t, rep.WriteJSON(&js))
	var recs []map[string]any
	require.NoError(t, json.Unmarshal(js.Bytes(), &recs))
	got := map[string]map[string]any{}
	for _, r := range recs {
		for k := range r {
			require.Contains(t, []string{"name", "value", "unit", "baseline", "ratio", "ratio_paired", "ratio_iqr", "working_set_bytes", "note"}, k)
		}
		got[r["name"].(string)] = r
	}
	for name, unit := range map[string]string{
		"keys.get.gomap_ns": "ns/op", "keys.get.shmsteer_ns": "ns/op", "keys.set.owner_ns": "ns/op",
		"keys.set.owner_p99_ns": "ns/op", "keys.get.throughput_2readers_x": "x", "kernels.add.16k.goloop_ns": "ns/op",
		"kernels.add.16k.shmsteer_ns": "ns/op", "kernels.add.16k.c_ns": "ns/op",
		"mem.overhead_ratio": "x", "mem.tp8_ratio": "x",
	} {
		require.Contains(t, got, name)
		require.Equal(t, unit, got[name]["unit"], name)
		require.Greater(t, got[name]["value"].(float64), 0.0, name)
	}
	require.Len(t, recs, 10, "skipped figures must not be in the JSON")
	for _, skipped := range []string{"keys.set.client_ns", "kernels.add.256k.c_ns", "steer.step.prefill.mixed_ns", "steer.step.prefill.kernel_ns"} {
		require.NotContains(t, got, skipped)
	}
	for name := range got {
		require.NotContains(t, name, variantSep, "a variant contender leaked into the report")
	}
	require.Equal(t, 1.25, got["mem.overhead_ratio"]["value"])
	require.Equal(t, 0.125, got["mem.tp8_ratio"]["value"])
	require.Equal(t, "8 fake ranks", got["mem.tp8_ratio"]["note"])
	require.InDelta(t, 149.5, got["keys.set.owner_ns"]["value"], 1)
	require.InDelta(t, 199, got["keys.set.owner_p99_ns"]["value"], 1)
	require.Equal(t, float64(2*kernelD*4), got["kernels.add.16k.goloop_ns"]["working_set_bytes"])

	// Ratio = ours / baseline, only where the baseline was measured.
	k := got["kernels.add.16k.shmsteer_ns"]
	require.Equal(t, "kernels.add.16k.c_ns", k["baseline"])
	// Measured in one alternation, the ratio pairs rounds (TestPairedRatio checks the value).
	require.Equal(t, true, k["ratio_paired"])
	require.Greater(t, k["ratio"].(float64), 0.0)
	require.Equal(t, "keys.get.gomap_ns", got["keys.get.shmsteer_ns"]["baseline"])
	require.NotContains(t, got["keys.set.owner_ns"], "ratio", "syncmanager was not run, so no ratio")
	require.NotContains(t, got["keys.get.gomap_ns"], "baseline")

	// Round trip through figure keeps names, values and units.
	var figs []figure
	require.NoError(t, json.Unmarshal(js.Bytes(), &figs))
	require.Equal(t, rep.Measured()[0].Name, figs[0].Name)
	require.Equal(t, rep.Measured()[0].Value, figs[0].Value)

	dir := t.TempDir()
	for _, name := range []string{"bench.png", "bench.svg"} {
		path := filepath.Join(dir, name)
		require.NoError(t, rep.Plot(path))
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Greater(t, len(b), 1000, name)
		if strings.HasSuffix(name, ".png") {
			require.Equal(t, "\x89PNG", string(b[:4]))
		}
	}
}

func TestMainFlags(t *testing.T) {
	// Parsing (unknown flags, arguments, -h) is the cobra command's: cmd/shmsteer's tests.
	var out, errb bytes.Buffer
	fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
	o := BindFlags(fs)
	dir := t.TempDir()
	js, png := filepath.Join(dir, "b.json"), filepath.Join(dir, "b.png")
	require.NoError(t, fs.Parse([]string{"--quick", "--rounds", "2", "--only", "keys.get.gomap,mem.", "--json", js, "--plot", png}))
	require.Equal(t, Options{Quick: true, Rounds: 2, Only: "keys.get.gomap,mem.", JSON: js, Plot: png}, *o)
	require.NoError(t, runMain(*o, sources{}, &out, &errb), errb.String())
	require.Contains(t, out.String(), "keys.get.gomap_ns")
	require.Contains(t, out.String(), "skipped mem.tp8_ratio")
	b, err := os.ReadFile(js)
	require.NoError(t, err)
	var recs []figure
	require.NoError(t, json.Unmarshal(b, &recs))
	require.Len(t, recs, 1)
	require.Equal(t, "keys.get.gomap_ns", recs[0].Name)
	st, err := os.Stat(png)
	require.NoError(t, err)
	require.Positive(t, st.Size())

	err = runMain(Options{Only: "mem.", JSON: filepath.Join(dir, "no", "such", "dir.json")}, sources{}, &out, &errb)
	require.ErrorContains(t, err, "--json")
	require.NotErrorIs(t, err, ErrUsage)
}

func TestChildDriver(t *testing.T) {
	p, err := startChild("test.echo", "a", "b")
	require.NoError(t, err)
	d, err := p.Run("us", 250)
	require.NoError(t, err)
	require.Equal(t, 250*time.Microsecond, d, "the child's own timing comes back")
	_, err = p.Run("fail", 1)
	require.ErrorIs(t, err, ErrChild)
	require.Contains(t, err.Error(), "op failed: a b")
	_, err = p.Run("nope", 1)
	require.ErrorContains(t, err, "unknown op")
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close is idempotent")
	_, err = p.Run("us", 1)
	require.ErrorIs(t, err, ErrChild)

	_, err = startChild("test.fail")
	require.ErrorIs(t, err, ErrChild)
	require.ErrorContains(t, err, "setup refused")
	_, err = startChild("test.nosuchrole")
	require.ErrorContains(t, err, ErrUnknownRole.Error())
}

func TestChildTimeoutKills(t *testing.T) {
	// A child that never answers: the driver must give up and kill it.
	cmd := exec.Command("sleep", "30")
	start := time.Now()
	_, err := startProc("sleeper", cmd, 300*time.Millisecond)
	require.ErrorIs(t, err, ErrChildTimeout)
	require.Less(t, time.Since(start), 5*time.Second)
	require.NotNil(t, cmd.ProcessState, "the child was waited for")
}

func TestThroughputWithGoChildren(t *testing.T) {
	// The built-in gomap role stands in for the shmsteer reader: two child
	// processes started at one instant.
	// Batches of 5 ms: with tinier ones the children's wake-up skew (tens of
	// microseconds on a loaded machine) is the whole window.
	cfg := runConfig{Rounds: 3, Target: 5 * time.Millisecond}
	cfg.Only = []string{"keys.get.throughput_2readers"}
	rep := runFigures(cfg, sources{KeysReaderProcs: gomapProcs})
	require.Len(t, rep.Figures, 1)
	f := rep.Figures[0]
	require.Empty(t, f.Skipped)
	require.Equal(t, "keys.get.throughput_2readers_x", f.Name)
	require.Equal(t, "x", f.Unit)
	// The figure is measured; how large it is depends on the machine's load at the time, so
	// its bounds are the bench's to report (throughputPlausible), not this test's to assert.
	require.Positive(t, f.Value)
	require.Equal(t, throughputPlausible(rep.Figures), rep.Warnings, "no warning but the plausibility one")
}

func TestThroughputPlausible(t *testing.T) {
	figs := []figure{
		{Name: "keys.get.throughput_2readers_x", Value: 2.94e-05},
		{Name: "keys.get.throughput_2gomaps_x", Value: 1.5},
		{Name: "keys.get.throughput_2gomaps_x", Value: 3.5},
		{Name: "keys.get.throughput_2readers_x", Skipped: "not run"},
		{Name: "keys.get.shmsteer_ns", Value: 0.01},
	}
	w := throughputPlausible(figs)
	require.Len(t, w, 2)
	require.Contains(t, w[0], "keys.get.throughput_2readers_x = 2.94e-05 is outside (0.2, 3)")
	require.Contains(t, w[1], "keys.get.throughput_2gomaps_x = 3.5 is outside")
}

func TestRunAtAlignsStarts(t *testing.T) {
	a, err := startChild("test.echo")
	require.NoError(t, err)
	defer a.Close()
	b, err := startChild("test.echo")
	require.NoError(t, err)
	defer b.Close()
	// Both sleep 200 ms from one instant: each window is measured from the instant, not from
	// when the child woke, so it is at least 200 ms; had the two run one after the other, one
	// window would be at least 400 ms. (Long sleeps keep a loaded machine's scheduling delays
	// small against the difference.)
	const sleep = 200 * time.Millisecond
	at := time.Now().Add(20 * time.Millisecond)
	var da, db time.Duration
	var ea, eb error
	done := make(chan struct{})
	go func() { db, eb = b.RunAt("sleep", int(sleep/time.Millisecond), at); close(done) }()
	da, ea = a.RunAt("sleep", int(sleep/time.Millisecond), at)
	<-done
	require.NoError(t, ea)
	require.NoError(t, eb)
	for _, d := range []time.Duration{da, db} {
		require.GreaterOrEqual(t, d, sleep)
		require.Less(t, d, 2*sleep)
	}
	require.Positive(t, a.Pid())
	_, err = a.command("sleep 1 at=soon")
	require.ErrorContains(t, err, "bad start")
}

func TestBestVariantAndBandwidth(t *testing.T) {
	k := hugeKernelSize
	post := kernelFigures(k)
	figs := post([]figure{
		{Name: "kernels.add.1g.shmsteer_ns", Value: 200e6, Rounds: 3, Samples: []float64{200e6, 100e6, 400e6}},
		{Name: "kernels.add.1g.c_ns#a", Value: 300e6, Rounds: 3},
		{Name: "kernels.add.1g.c_ns#b", Value: 250e6, Rounds: 3},
		{Name: "kernels.add.1g.c_ns#c", Skipped: "no such shape"},
		{Name: "kernels.add.1g.bw_fraction#copy", Value: 180e6, Rounds: 3, Samples: []float64{180e6, 90e6, 360e6}},
		// Faster in round 3 only: per round the faster copy counts, so the ratios are 0.9, 0.9, 0.5.
		{Name: "kernels.add.1g.bw_fraction#copy64k", Value: 400e6, Rounds: 3, Samples: []float64{400e6, 400e6, 200e6}},
	})
	byName := map[string]figure{}
	for _, f := range figs {
		byName[f.Name] = f
	}
	require.Len(t, figs, 3)
	c := byName["kernels.add.1g.c_ns"]
	require.Equal(t, 250e6, c.Value)
	require.Contains(t, c.Note, "variant: b")
	require.Contains(t, c.Note, "c: no such shape")
	require.Equal(t, k.workingSet(), byName["kernels.add.1g.shmsteer_ns"].WorkingSet)
	require.Equal(t, int64(1<<30+kernelD*4), k.workingSet())
	bw := byName["kernels.add.1g.bw_fraction"]
	require.InDelta(t, 0.9, bw.Value, 1e-12)
	require.Equal(t, "x", bw.Unit)
	require.Contains(t, bw.Note, "2 GiB per call")
	require.Contains(t, bw.Note, "copy 180.00 ms, copy64k 400.00 ms")

	all := kernelFigures(kernelSizes[0])([]figure{{Name: "kernels.add.16k.c_ns#a", Skipped: "no cgo"}})
	require.Equal(t, []figure{{Name: "kernels.add.16k.c_ns", Unit: "ns/op", Skipped: "no cgo"}}, all)
}

func TestQuickSkipsHugeCases(t *testing.T) {
	cfg := tiny()
	cfg.Quick = true
	cfg.Only = []string{"kernels.add.1g", "keys.get.cold"}
	rep := runFigures(cfg, fakeSources())
	require.Empty(t, rep.Measured())
	require.Len(t, rep.Figures, 7)
	for _, f := range rep.Figures {
		require.Contains(t, f.Skipped, ErrQuickSkip.Error(), f.Name)
	}
}

func TestGoLoopAdd(t *testing.T) {
	h, v := kernelData(3)
	want := append([]float32(nil), h...)
	for i := range want {
		want[i] += 0.5 * v[i%kernelD]
	}
	goLoopAdd(h, kernelD, 0.5, v)
	require.Equal(t, want, h)
}

func TestColdIndexUniform(t *testing.T) {
	state := uint64(1)
	var buckets [16]int
	for range 1 << 16 {
		i := coldIndex(&state)
		require.GreaterOrEqual(t, i, 0)
		require.Less(t, i, coldNumKeys)
		buckets[i>>16]++
	}
	for _, n := range buckets {
		require.InDelta(t, 4096, n, 400)
	}
	keys := coldKeys()
	require.Len(t, keys, coldNumKeys)
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, keys[12345])
	require.Equal(t, keys[7], coldKeys()[7])
}

// TestPairedRatio checks Finish's ratio of two figures measured in one alternation: the median
// of the per-round ratios (not the ratio of the medians) with their spread, and the plain
// ratio of values for figures of different groups or without rounds.
func TestPairedRatio(t *testing.T) {
	ours := figure{Name: "kernels.add.16k.shmsteer_ns", Value: 110, Group: 1, Samples: []float64{100, 110, 300, 90, 120}}
	base := figure{Name: "kernels.add.16k.c_ns", Value: 100, Group: 1, Samples: []float64{100, 100, 250, 100, 60}}
	rep := &report{}
	rep.Add(ours, base)
	rep.Finish()
	got := rep.Figures[slices.IndexFunc(rep.Figures, func(f figure) bool { return f.Name == ours.Name })]
	// Per-round ratios 1, 1.1, 1.2, 0.9, 2: median 1.1, quartiles 1 and 1.2.
	require.True(t, got.RatioPaired)
	require.InDelta(t, 1.1, got.Ratio, 1e-12)
	require.InDelta(t, 0.2/1.1, got.RatioSpread, 1e-12)

	// The medians' ratio (120/100) differs from the paired one (1.0): rounds 1-3 saw a load
	// that slowed both.
	ours.Samples, ours.Value = []float64{120, 240, 360}, 240
	base.Samples, base.Value = []float64{120, 240, 200}, 200
	rep = &report{}
	rep.Add(ours, base)
	rep.Finish()
	got = rep.Figures[slices.IndexFunc(rep.Figures, func(f figure) bool { return f.Name == ours.Name })]
	require.InDelta(t, 1.0, got.Ratio, 1e-12)

	for _, tc := range []struct {
		name  string
		group int
	}{{"other group", 2}, {"no group", 0}} {
		b := base
		b.Group = tc.group
		rep = &report{}
		rep.Add(ours, b)
		rep.Finish()
		got = rep.Figures[slices.IndexFunc(rep.Figures, func(f figure) bool { return f.Name == ours.Name })]
		require.False(t, got.RatioPaired, tc.name)
		require.InDelta(t, 1.2, got.Ratio, 1e-12, tc.name)
	}
}

// TestAlternateRotates checks that a rotating alternation starts round r at contender r.
func TestAlternateRotates(t *testing.T) {
	var order []string
	mk := func(name string) contender {
		return contender{name + "_ns", func() (Op, func() error, error) {
			return func(n int) (time.Duration, error) {
				order = append(order, name)
				return time.Duration(n) * time.Millisecond, nil
			}, nil, nil
		}}
	}
	_, warns := alternate(runConfig{Rounds: 4, Target: time.Millisecond}, nil, []contender{mk("a"), mk("b"), mk("c")}, true)
	require.Empty(t, warns)
	// One calibration batch each, then a b c, b c a, c a b, a b c.
	require.Equal(t, strings.Split("abcabcbcacababc", ""), order)
}

// TestCPUOp checks cpuOp's clock: a batch that sleeps 30 ms costs its thread almost no CPU
// time, a batch that spins for 30 ms costs about that, and with the wall clock the sleep
// counts.
func TestCPUOp(t *testing.T) {
	if _, ok := threadCPU(); !ok {
		t.Skip("no thread CPU clock on this system: CPUOp is GoOp here")
	}
	sleep := cpuOp(func(int) error { time.Sleep(30 * time.Millisecond); return nil })
	spin := cpuOp(func(int) error {
		for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
		}
		return nil
	})
	d, err := sleep(1)
	require.NoError(t, err)
	require.Less(t, d, 10*time.Millisecond, "a sleeping thread runs for almost no CPU time")
	d, err = spin(1)
	require.NoError(t, err)
	require.Greater(t, d, time.Duration(0))
	require.LessOrEqual(t, d, 31*time.Millisecond, "a thread cannot run longer than the wall time it spun")

	wallClock.Store(true)
	defer wallClock.Store(false)
	d, err = sleep(1)
	require.NoError(t, err)
	require.GreaterOrEqual(t, d, 30*time.Millisecond, "with the wall clock the sleep counts")
}

// TestCPUOpChunks checks that a cpuOp batch runs in chunks of about yieldEvery once it knows
// the time per op (from its previous batch), that the chunks add up to the batch, and that
// the time between chunks (the yield) is not counted.
func TestCPUOpChunks(t *testing.T) {
	if _, ok := threadCPU(); !ok {
		t.Skip("no thread CPU clock on this system")
	}
	const perOp = 500 * time.Microsecond
	var chunks []int
	op := cpuOp(func(n int) error {
		chunks = append(chunks, n)
		// Spin for n*perOp of this thread's CPU time, so a busy machine does not change the
		// time per op cpuOp sees.
		start, _ := threadCPU()
		for now, _ := threadCPU(); now-start < time.Duration(n)*perOp; now, _ = threadCPU() {
		}
		return nil
	})
	_, err := op(2) // unknown time per op: one chunk
	require.NoError(t, err)
	require.Equal(t, []int{2}, chunks)
	chunks = nil
	d, err := op(40)
	require.NoError(t, err)
	sum, most := 0, 0
	for _, k := range chunks {
		sum, most = sum+k, max(most, k)
	}
	require.Equal(t, 40, sum, "chunks %v", chunks)
	require.Greater(t, len(chunks), 1, "chunks %v", chunks)
	require.LessOrEqual(t, most, int(yieldEvery/perOp), "chunks %v", chunks) // 4
	require.GreaterOrEqual(t, d, 40*perOp)
	require.LessOrEqual(t, d, 40*perOp+5*time.Millisecond, "about the chunks' own time")
}
