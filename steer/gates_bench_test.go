package steer

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shmsteer/shmsteer/shm"
)

// BenchmarkGatedDecode is the dense decode step of BenchmarkDecodeDense (32 layers × 5 hooks,
// D = 4096, 64 requests of one row, distinct steering at every site), ungated, against the
// same step where every request also carries a this_token probe gate (probe at post_block 16,
// an add of a named vector at post_block 17–20) and a next_step attenuation on the same probe.
// The two run in alternating order, each step timed by the thread's CPU time (the machine is
// shared), and the benchmark reports both medians and their ratio (issue 23's goal: gated ≤
// 1.15 × ungated).
func BenchmarkGatedDecode(b *testing.B) {
	plain, closePlain := gatedDecodeStep(b, false)
	defer closePlain()
	gated, closeGated := gatedDecodeStep(b, true)
	defer closeGated()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	timed := func(step func()) float64 {
		t0 := cpu()
		step()
		return float64(cpu() - t0)
	}
	var tp, tg []float64
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		if n%2 == 0 {
			tp = append(tp, timed(plain))
			tg = append(tg, timed(gated))
		} else {
			tg = append(tg, timed(gated))
			tp = append(tp, timed(plain))
		}
	}
	b.StopTimer()
	mp, mg := median(tp), median(tg)
	b.ReportMetric(mp, "ungated_cpu_ns/step")
	b.ReportMetric(mg, "gated_cpu_ns/step")
	b.ReportMetric(mg/mp, "gated/ungated")
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

func gatedDecodeStep(b *testing.B, gated bool) (func(), func()) {
	st, batch, closeAll := gatedDecodeSetup(b, gated)
	const d, layers = 4096, 32
	hooks := st.e.cfg.NumHooks()
	h := make([]float32, len(batch)*d)
	vec := func(seed int) []float32 {
		v := make([]float32, d)
		for i := range v {
			v[i] = float32((seed*31+i)%97)/97 - 0.5
		}
		return v
	}
	for i := range batch {
		copy(h[i*d:], vec(i)) // rows whose probe scores differ
	}
	step := func() {
		if err := st.Begin(0); err != nil {
			b.Fatal(err)
		}
		for l := 0; l < layers; l++ {
			for hk := 0; hk < hooks; hk++ {
				if err := st.Apply(HookID(hk), l, h, batch); err != nil {
					b.Fatal(err)
				}
			}
		}
		st.End()
	}
	step()
	if gated && st.Stats().GateEvaluations == 0 {
		b.Fatal("no gate evaluated")
	}
	return step, closeAll
}

// gatedDecodeSetup makes the benchmarks' engine, requests (gated or not) and Stepper.
func gatedDecodeSetup(b *testing.B, gated bool) (*Stepper, []Span, func()) {
	const d, layers, reqs = 4096, 32, 64
	cfg := ModelConfig{Hidden: d, Layers: layers}
	rc, err := RegionConfig(cfg, shm.Config{IndexSlots: 1 << 12, ArenaBytes: 448 << 20})
	if err != nil {
		b.Fatal(err)
	}
	r, err := shm.Create(rc)
	if err != nil {
		b.Fatal(err)
	}
	e, err := Open(r, nil, Options{})
	if err != nil {
		b.Fatal(err)
	}
	hooks := cfg.NumHooks()
	vec := func(seed int) []float32 {
		v := make([]float32, d)
		for i := range v {
			v[i] = float32((seed*31+i)%97)/97 - 0.5
		}
		return v
	}
	if _, err := e.RegisterProbe("p", []Vector{{Hook: "post_block", Layer: 16, Scale: 1, Data: vec(7)}}); err != nil {
		b.Fatal(err)
	}
	var sv []Vector
	for l := 17; l <= 20; l++ {
		sv = append(sv, Vector{Hook: "post_block", Layer: l, Scale: 1, Data: vec(l)})
	}
	if _, err := e.Register("s", sv); err != nil {
		b.Fatal(err)
	}
	probe := When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0, Sharpness: 1}
	gates := []Gate{
		{When: probe, Scope: ScopeThisToken, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 0.5}},
		{When: probe, Scope: ScopeNextStep, Apply: GateApply{Kind: ApplyAttenuate, Strength: 0.5}},
	}
	batch := make([]Span, reqs)
	for i := range batch {
		id := fmt.Sprintf("req-%02d", i)
		batch[i] = Span{ID: id, Start: i, End: i + 1, Phase: PhaseDecode}
		var s Steering
		for hk := 0; hk < hooks; hk++ {
			for l := 0; l < layers; l++ {
				s.Decode.Vectors = append(s.Decode.Vectors, Vector{Hook: cfg.HookName(HookID(hk)), Layer: l, Scale: 1e-3, Data: vec(1000 + i*hooks*layers + hk*layers + l)})
			}
		}
		a := Admission{RequestID: id, Override: &s}
		if gated {
			a.Gates = gates
		}
		if _, err := e.Admit(a); err != nil {
			b.Fatal(err)
		}
	}
	st := e.NewStepper()
	return st, batch, func() { st.Close(); r.Close() }
}

// BenchmarkGatedDecodeBatch is BenchmarkGatedDecode's step on the device path: the engine's
// work per step of a device worker (Batch.Resolve of the 64 requests, then, when gated,
// Report of their probe scores), ungated against gated (every request with the this_token
// probe gate and the next_step attenuation), steady state (nothing to upload), alternating,
// by the thread's CPU time. The device's own arithmetic (gather-adds, probe dots) is not in it:
// python/benchmarks/device_step.py --gates times the whole step on CPU tensors.
func BenchmarkGatedDecodeBatch(b *testing.B) {
	plain, closePlain := gatedBatchStep(b, false)
	defer closePlain()
	gated, closeGated := gatedBatchStep(b, true)
	defer closeGated()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() time.Duration { // the thread's CPU clock (finer than getrusage's ticks)
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ts.Nano())
	}
	timed := func(step func()) float64 {
		t0 := cpu()
		for range 20 {
			step()
		}
		return float64(cpu()-t0) / 20
	}
	var tp, tg []float64
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		if n%2 == 0 {
			tp = append(tp, timed(plain))
			tg = append(tg, timed(gated))
		} else {
			tg = append(tg, timed(gated))
			tp = append(tp, timed(plain))
		}
	}
	b.StopTimer()
	mp, mg := median(tp), median(tg)
	b.ReportMetric(mp, "ungated_cpu_ns/step")
	b.ReportMetric(mg, "gated_cpu_ns/step")
	b.ReportMetric(mg/mp, "gated/ungated")
}

func gatedBatchStep(b *testing.B, gated bool) (func(), func()) {
	st, batch, closeAll := gatedDecodeSetup(b, gated)
	bt, err := st.NewBatch(BatchOptions{})
	if err != nil {
		b.Fatal(err)
	}
	scores := make([]float32, len(batch)*2)
	for i := range scores {
		scores[i] = float32(i%3) - 1 // some rows fire
	}
	step := func() {
		if err := bt.Resolve(0, batch, len(batch)); err != nil {
			b.Fatal(err)
		}
		st.End()
		if bt.AwaitsReport() {
			if err := bt.Report(scores[:len(batch)*bt.Gates.Cols]); err != nil {
				b.Fatal(err)
			}
		}
	}
	for range 3 { // the next_step pulses engage in the second step: steady from the third
		step()
	}
	if gated && bt.Gates.Cols != 2 {
		b.Fatalf("gate columns %d, want 2", bt.Gates.Cols)
	}
	if len(bt.Updates) != 0 || len(bt.Gates.Updates) != 0 {
		b.Fatal("not steady")
	}
	return step, closeAll
}
