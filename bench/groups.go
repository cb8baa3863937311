package bench

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// variantSep separates a figure name from the name of one of the contenders it is derived
// from ("kernels.add.16k.c_ns#native512"); such contenders are measured like any other but
// reported only through the figure a group's post step derives from them.
const variantSep = "#"

// baseName is the figure a contender contributes to: its name up to variantSep.
func baseName(name string) string {
	base, _, _ := strings.Cut(name, variantSep)
	return base
}

// kernelFigures turns one size's raw figures into the reported ones: the C figure is the
// fastest gcc variant (the note names it and lists the others), every add figure carries its
// working set, and at 1g the copy reference becomes kernels.add.1g.bw_fraction.
func kernelFigures(k kernelSize) func([]figure) []figure {
	return func(raw []figure) []figure {
		cName := "kernels.add." + k.Tag + ".c_ns"
		var out, cs, copies []figure
		for i := range raw {
			f := raw[i]
			switch base := baseName(f.Name); {
			case base == cName:
				cs = append(cs, f)
			case strings.HasSuffix(base, "bw_fraction"):
				copies = append(copies, f)
			default:
				if f.Skipped == "" {
					f.WorkingSet = k.workingSet()
				}
				out = append(out, f)
			}
		}
		if len(cs) > 0 {
			out = append(out, bestVariant(cName, cs, k))
		}
		if len(copies) > 0 {
			out = append(out, bandwidthFraction(k, out, fastestPerRound(copies)))
		}
		return out
	}
}

// bestVariant reports the fastest measured variant as name, noting which won and what each
// variant measured; skipped only when every variant was.
func bestVariant(name string, cs []figure, k kernelSize) figure {
	best := -1
	var notes, skips []string
	for i, f := range cs {
		_, variant, _ := strings.Cut(f.Name, variantSep)
		if f.Skipped != "" {
			skips = append(skips, variant+": "+f.Skipped)
			continue
		}
		notes = append(notes, fmt.Sprintf("%s %s", variant, formatValue(f)))
		if best < 0 || f.Value < cs[best].Value {
			best = i
		}
	}
	if best < 0 {
		f := figure{Name: name, Unit: unitOf(name), Skipped: strings.Join(skips, "; ")}
		if !slices.ContainsFunc(cs, func(g figure) bool { return g.Skipped != cs[0].Skipped }) {
			f.Skipped = cs[0].Skipped // one reason for all, said once
		}
		return f
	}
	f := cs[best]
	_, variant, _ := strings.Cut(f.Name, variantSep)
	f.Name = name
	f.WorkingSet = k.workingSet()
	f.Note = fmt.Sprintf("best gcc -O3 -march=native variant: %s (ns/op: %s)", variant, strings.Join(notes, ", "))
	if samples, picks, ok := leaveOneOutBest(cs); ok {
		f.Samples = samples
		f.Value = median(samples)
		f.Spread = (quantile(samples, 0.75) - quantile(samples, 0.25)) / f.Value
		f.Note += "; each round's figure is the variant of lowest median over the other rounds (" + picks + ")"
	}
	if len(skips) > 0 {
		f.Note += "; not run: " + strings.Join(skips, "; ")
	}
	return f
}

// leaveOneOutBest is the best variant's rounds without the winner's curse: round r's figure is
// round r of the variant whose median over the rounds other than r is lowest, so no round's
// own time takes part in choosing whose time it is. Picking by the median over all rounds and
// then taking that variant's rounds favours a variant whose rounds happened to run fast: among
// statistically equal variants (on the CPU this was written on, gcc compiles the 512-bit and the
// default variants to the same machine code, two identical pairs among four) the pick's rounds
// are then biased low, and every ratio to it high (TestLeaveOneOutBest). A real difference
// between variants still decides every round. picks names the variants chosen and how often;
// ok is false unless every measured variant has the same number (at least 3) of rounds.
func leaveOneOutBest(cs []figure) (samples []float64, picks string, ok bool) {
	var ok2 []figure
	for _, f := range cs {
		if f.Skipped == "" {
			ok2 = append(ok2, f)
		}
	}
	if len(ok2) == 0 {
		return nil, "", false
	}
	n := len(ok2[0].Samples)
	for _, f := range ok2 {
		if len(f.Samples) != n || n < 3 {
			return nil, "", false
		}
	}
	count := make([]int, len(ok2))
	for r := range n {
		best, bestMed := -1, 0.0
		for i, f := range ok2 {
			others := append(slices.Clone(f.Samples[:r]), f.Samples[r+1:]...)
			if m := median(others); best < 0 || m < bestMed {
				best, bestMed = i, m
			}
		}
		samples = append(samples, ok2[best].Samples[r])
		count[best]++
	}
	var ps []string
	for i, f := range ok2 {
		if count[i] > 0 {
			_, v, _ := strings.Cut(f.Name, variantSep)
			ps = append(ps, fmt.Sprintf("%s in %d", v, count[i]))
		}
	}
	return samples, strings.Join(ps, ", "), true
}

// fastestPerRound merges measurements of one quantity by different methods into one figure
// whose every round is the fastest method of that round; its Note lists each method's median.
// Skipped only when every method was.
func fastestPerRound(fs []figure) figure {
	var ok []figure
	var notes []string
	for _, f := range fs {
		_, method, _ := strings.Cut(f.Name, variantSep)
		if f.Skipped == "" {
			ok = append(ok, f)
			notes = append(notes, fmt.Sprintf("%s %.2f ms", method, f.Value/1e6))
		}
	}
	if len(ok) == 0 {
		return fs[0]
	}
	out := ok[0]
	out.Samples = slices.Clone(out.Samples)
	for _, f := range ok[1:] {
		out.Value = min(out.Value, f.Value)
		for r := range min(len(out.Samples), len(f.Samples)) {
			out.Samples[r] = min(out.Samples[r], f.Samples[r])
		}
	}
	out.Note = strings.Join(notes, ", ")
	return out
}

// bandwidthFraction is the add's achieved bytes/s over the copy's, both measured in the same
// alternation: the add reads and writes h (2 × len(h) × 4 bytes per call), copy() reads the
// same h and writes a second buffer of its size (the same bytes moved, counted as STREAM
// counts a copy), so the fraction is copy time / add time, taken round by round and the
// median reported. A copy's stores may also read each
// destination line first (a read-for-ownership the in-place add does not pay), so the
// fraction can exceed 1.
func bandwidthFraction(k kernelSize, figs []figure, cp figure) figure {
	name := "kernels.add." + k.Tag + ".bw_fraction"
	f := figure{Name: name, Unit: unitOf(name)}
	i := slices.IndexFunc(figs, func(f figure) bool { return f.Name == "kernels.add."+k.Tag+".shmsteer_ns" })
	switch {
	case cp.Skipped != "":
		f.Skipped = "copy reference: " + cp.Skipped
	case i < 0:
		f.Skipped = "kernels.add." + k.Tag + ".shmsteer_ns not run"
	case figs[i].Skipped != "":
		f.Skipped = "add: " + figs[i].Skipped
	default:
		// Paired round by round (the copy runs right after the add in each round, so both
		// see the machine's load of the moment), then the median over rounds.
		add := figs[i]
		moved := 2 * float64(k.T) * kernelD * 4
		var ratios []float64
		for r := range min(len(add.Samples), len(cp.Samples)) {
			ratios = append(ratios, cp.Samples[r]/add.Samples[r])
		}
		if len(ratios) == 0 {
			ratios = []float64{cp.Value / add.Value}
		}
		f.Value = median(ratios)
		f.Rounds, f.Batch = len(ratios), add.Batch
		f.Spread = (quantile(ratios, 0.75) - quantile(ratios, 0.25)) / f.Value
		f.Note = fmt.Sprintf("median of per-round ratios; add moves %s per call (read + write h) at %.2f GB/s (median); Go copy() of h into a second %s buffer (whole, or 64 KiB at a time), right after the add each round, at %.2f GB/s (bytes counted as STREAM does; the copy may also pay a read-for-ownership of its destination)",
			formatBytes(int64(moved)), moved/add.Value, formatBytes(int64(k.T)*kernelD*4), moved/cp.Value) +
			"; the faster copy each round, of: " + cp.Note
	}
	return f
}

// throughputContenders measure reads per second over one aligned wall-clock window: "#1"
// starts one reader at an instant a few milliseconds ahead and times from that instant to
// its last read; "#2" starts two readers at one instant with the same count each and times
// to the last read of either. Readers that ran one after the other take twice the window, so
// only a real overlap scores above 1. throughputFigure turns the two into the ratio.
func throughputContenders(name string, start func(k int) ([]*proc, func() error, error)) []contender {
	var mu sync.Mutex
	var procs []*proc
	one := func() (Op, func() error, error) {
		if start == nil {
			return nil, nil, ErrNotWired
		}
		ps, cleanup, err := start(2)
		if err == nil && len(ps) != 2 {
			err = fmt.Errorf("started %d readers, want 2", len(ps))
		}
		if err != nil {
			return nil, cleanup, err
		}
		mu.Lock()
		procs = ps
		mu.Unlock()
		return alignedOp(ps[:1]), cleanup, nil
	}
	two := func() (Op, func() error, error) {
		mu.Lock()
		defer mu.Unlock()
		if procs == nil {
			return nil, nil, errors.New("readers not started")
		}
		return alignedOp(procs), nil, nil
	}
	// The cleanup of the first setup ends both readers, after both contenders are done:
	// alternate runs cleanups last, in reverse order.
	return []contender{{name + variantSep + "1", one}, {name + variantSep + "2", two}}
}

// alignLead is how far ahead of the commands the aligned start is set: enough for every
// child to receive its command and be waiting when the window opens.
const alignLead = 5 * time.Millisecond

// alignedOp runs "get" n times in each of ps, all starting at one wall-clock instant, and
// returns the time from that instant to the end of the last one.
func alignedOp(ps []*proc) Op {
	return func(n int) (time.Duration, error) {
		at := time.Now().Add(alignLead)
		ds := make([]time.Duration, len(ps))
		errs := make([]error, len(ps))
		var wg sync.WaitGroup
		for i, p := range ps {
			wg.Go(func() { ds[i], errs[i] = p.RunAt("get", n, at) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return 0, err
		}
		return slices.Max(ds), nil
	}
}

// throughputFigures turns the contenders of throughputContenders, for each of names, into
// throughputFigure; other figures pass through.
func throughputFigures(names ...string) func([]figure) []figure {
	return func(figs []figure) []figure {
		var out []figure
		for _, name := range names {
			var mine []figure
			for _, f := range figs {
				if baseName(f.Name) == name {
					mine = append(mine, f)
				}
			}
			if len(mine) > 0 {
				out = append(out, throughputFigure(name, mine))
			}
		}
		for _, f := range figs {
			if !slices.Contains(names, baseName(f.Name)) {
				out = append(out, f)
			}
		}
		return out
	}
}

// Bounds of a plausible two-reader throughput figure: two processes reading private memory
// on one host scale from not at all (or somewhat worse, on a loaded machine) to perfectly,
// 2.0. A value outside them means the two windows did not overlap as they should.
const (
	throughputPlausibleMin = 0.2
	throughputPlausibleMax = 3.0
)

// throughputPlausible warns of a throughput figure outside the plausible bounds: the bench
// reports it with the figure (a timed bound belongs in the bench, where the machine's load is
// part of the result, not in a test that would fail with it).
func throughputPlausible(figs []figure) []string {
	var out []string
	for _, f := range figs {
		if f.Skipped != "" || !strings.HasPrefix(f.Name, "keys.get.throughput_") {
			continue
		}
		if !(f.Value > throughputPlausibleMin && f.Value < throughputPlausibleMax) {
			out = append(out, fmt.Sprintf("%s = %.3g is outside (%g, %g): the readers' windows did not overlap (a loaded machine, children woken late); rerun it on a quieter machine",
				f.Name, f.Value, throughputPlausibleMin, throughputPlausibleMax))
		}
	}
	return out
}

// throughputFigure is 2 × (one reader's time per read) / (two readers' window per read each):
// the aggregate throughput of two readers in one window over one reader's. 2.0 is perfect
// scaling, 1.0 none.
func throughputFigure(name string, figs []figure) figure {
	f := figure{Name: name, Unit: unitOf(name)}
	switch {
	case len(figs) < 2:
		f.Skipped = "not run"
	case figs[0].Skipped != "":
		f.Skipped = "1 reader: " + figs[0].Skipped
	case figs[1].Skipped != "":
		f.Skipped = "2 readers: " + figs[1].Skipped
	default:
		one, two := figs[0], figs[1]
		f.Value = 2 * one.Value / two.Value
		f.Rounds, f.Batch = min(one.Rounds, two.Rounds), two.Batch
		f.Spread = max(one.Spread, two.Spread)
		f.Note = fmt.Sprintf("aggregate reads/s of 2 reader processes started at one wall-clock instant (window to the last one's end) over 1 reader's: %.1f vs %.1f M reads/s",
			2e3/two.Value, 1e3/one.Value)
	}
	return f
}

// gomapProcs starts k children each reading a private Go map: the machine's control for the
// 2-reader throughput (no sharing at all, so it scales only as far as the cores and caches do).
func gomapProcs(k int) ([]*proc, func() error, error) {
	var procs []*proc
	closeAll := func() error {
		var errs []error
		for _, p := range procs {
			errs = append(errs, p.Close())
		}
		return errors.Join(errs...)
	}
	for range k {
		p, err := startChild("bench.gomap")
		if err != nil {
			return nil, closeAll, err
		}
		procs = append(procs, p)
	}
	return procs, closeAll, nil
}

// latency turns a latencySetup into a contender of its group whose rounds keep every per-call
// duration; post reports the median (p50) and the 99th percentile over the timed rounds.
type latency struct {
	rounds   int
	p50, p99 string
	setup    latencySetup
	mu       sync.Mutex
	calls    [][]time.Duration
}

func newLatency(cfg runConfig, p50, p99 string, s latencySetup) *latency {
	return &latency{rounds: cfg.Rounds, p50: p50, p99: p99, setup: s}
}

func (l *latency) contender() contender {
	return contender{l.p50, func() (Op, func() error, error) {
		if l.setup == nil {
			return nil, nil, ErrNotWired
		}
		run, cleanup, err := l.setup()
		if err != nil {
			return nil, cleanup, err
		}
		return func(n int) (time.Duration, error) {
			lat := make([]time.Duration, n)
			if err := run(lat); err != nil {
				return 0, err
			}
			var sum time.Duration
			for _, d := range lat {
				sum += d
			}
			l.mu.Lock()
			l.calls = append(l.calls, lat)
			l.mu.Unlock()
			return sum, nil
		}, cleanup, nil
	}}
}

func (l *latency) post(figs []figure) []figure {
	i := slices.IndexFunc(figs, func(f figure) bool { return f.Name == l.p50 })
	if i < 0 {
		return figs
	}
	p99 := figure{Name: l.p99, Unit: unitOf(l.p99), Skipped: figs[i].Skipped}
	if figs[i].Skipped == "" {
		// The timed rounds are the last calls; the ones before were calibration.
		calls := l.calls[max(0, len(l.calls)-figs[i].Rounds):]
		var xs []float64
		for _, c := range calls {
			for _, d := range c {
				xs = append(xs, float64(d.Nanoseconds()))
			}
		}
		f := &figs[i]
		f.Value = quantile(xs, 0.5)
		f.Samples = nil // batch means, not what the p50 is of: no ratio pairs them
		p99.Value = quantile(xs, 0.99)
		p99.Rounds, p99.Batch, p99.Spread = f.Rounds, f.Batch, f.Spread
		f.Note = fmt.Sprintf("p50 of %d calls each timed alone (%d rounds), not a batch mean", len(xs), len(calls))
		p99.Note = fmt.Sprintf("p99 of the same %d calls", len(xs))
	}
	out := slices.Clone(figs)
	return slices.Insert(out, i+1, p99)
}
