package bench

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// ErrNotWired reports a shmsteer contender whose hook in sources is nil.
var ErrNotWired = errors.New("shmsteer: bench: not wired")

// ErrBadOp reports an Op that returned a non-positive duration, which would
// turn into a meaningless ns/op.
var ErrBadOp = errors.New("shmsteer: bench: op reported no elapsed time")

// Op runs the measured operation n times and returns how long the n runs took.
// Ops that run in this process time themselves with [goOp]; ops that run in a
// child process return the duration the child measured, so the pipe round
// trip to the child is not part of the figure.
type Op func(n int) (time.Duration, error)

// setupFunc prepares a contender: it returns the op and a cleanup (which may be
// nil). An error marks the contender as skipped, with the error as reason.
type setupFunc func() (op Op, cleanup func() error, err error)

// contender is one measured thing. Name is the figure name, e.g.
// "keys.get.gomap_ns"; its suffix decides the unit (see [unitOf]).
type contender struct {
	Name  string
	Setup setupFunc
}

// goOp turns a function that runs an operation n times into an [Op] timed
// with the monotonic clock around the whole batch.
func goOp(f func(n int) error) Op {
	return func(n int) (time.Duration, error) {
		start := time.Now()
		err := f(n)
		return time.Since(start), err
	}
}

// cpuOp is goOp for an operation that only computes on its goroutine (no blocking call, no
// other goroutine's or process's work): the batch runs locked to one OS thread and is timed
// with that thread's CPU time, so the time other processes of a shared machine hold the CPU
// is not in the figure, while stalls on memory and the caches other processes evict still
// are. runConfig.WallClock (and a system without the thread clock) time it by the monotonic
// clock. The kernel and step figures use it: on a loaded 2-core machine their batches' wall
// time swung 2-3x from round to round while their CPU time stayed within a few percent.
//
// The batch runs in chunks of about yieldEvery (sized from the previous batch's time per op),
// with a runtime.Gosched between them, outside the timed chunks. A goroutine that runs on
// one scheduling slice for 10 ms gets the runtime's preemption signal from then on, and one
// that spends its time in assembly (where the signal cannot preempt it) gets it again at
// each of sysmon's wake-ups until one lands in Go code: that storm cost the add kernel 6-8%
// of its time at 256 KiB and 4 MiB (bench against GODEBUG=asyncpreemptoff=1, 1.065-1.099x
// gcc against 0.983-1.011x), while gcc's loop, inside a cgo call, gets none.
func cpuOp(f func(n int) error) Op {
	var perOp time.Duration // of the last batch; sizes the chunks
	return func(n int) (time.Duration, error) {
		now, yield := monotonic(), runtime.Gosched
		if !wallClock.Load() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if _, ok := threadCPU(); ok {
				// Each chunk on one thread, timed by its clock; the thread is let go for the
				// yield, since a locked one hands its P to another thread and sleeps (and
				// may wake on the other core, away from its L2).
				now = threadCPU
				yield = func() {
					runtime.UnlockOSThread()
					runtime.Gosched()
					runtime.LockOSThread()
				}
			}
		}
		return runChunked(f, n, &perOp, now, yield)
	}
}

// sliceOp is goOp, by the monotonic clock, for a loop of compute-only calls run in chunks as
// cpuOp runs its batches: the key reads, whose batches otherwise run past the 10 ms slice,
// and of which the engine's spends part of its time in assembly and the runtime's memmove
// and memequal, where the preemption signal cannot land (BenchmarkClientReaderGet's profile:
// about a sixth), and a Go map's lookup less.
func sliceOp(f func(n int) error) Op {
	var perOp time.Duration
	return func(n int) (time.Duration, error) { return runChunked(f, n, &perOp, monotonic(), runtime.Gosched) }
}

// monotonic is a clock of the time since it was made.
func monotonic() func() (time.Duration, bool) {
	base := time.Now()
	return func() (time.Duration, bool) { return time.Since(base), true }
}

// runChunked runs f n times in chunks of about yieldEvery by *perOp (the whole batch while
// *perOp is unknown), calling yield between them, and returns the chunks' time by now; it
// leaves this batch's time per op in *perOp.
func runChunked(f func(n int) error, n int, perOp *time.Duration, now func() (time.Duration, bool), yield func()) (time.Duration, error) {
	chunk := n
	if *perOp > 0 {
		chunk = max(1, int(yieldEvery / *perOp))
	}
	var total time.Duration
	for done := 0; done < n; {
		k := min(chunk, n-done)
		start, _ := now()
		err := f(k)
		end, _ := now()
		total += end - start
		done += k
		if err != nil {
			return total, err
		}
		if done < n {
			yield()
		}
	}
	if n > 0 {
		*perOp = total / time.Duration(n)
	}
	return total, nil
}

// yieldEvery is how long a cpuOp batch computes between yields: well inside the runtime's
// 10 ms scheduling slice (see cpuOp).
const yieldEvery = 2 * time.Millisecond

// wallClock is the run's runConfig.WallClock, read by cpuOp.
var wallClock atomic.Bool

// runConfig controls a run. The zero value is not useful; see [defaultConfig]
// and [quickConfig].
type runConfig struct {
	// Rounds is how many times each contender is measured, alternating with
	// the other contenders of its group; the figure is the median.
	Rounds int
	// Target is the least duration of one timed batch; the batch size n is
	// calibrated per contender to reach it, so timer resolution and per-call
	// overhead of the driver stay negligible.
	Target time.Duration
	// Only, when non-empty, keeps the contenders whose name starts with one
	// of these prefixes; the others are not run and not reported.
	Only []string
	// Progress receives a one-line, carriage-return-rewritten progress
	// display; nil means silent.
	Progress io.Writer
	// Quick leaves out the figures that need gigabytes or a 1M-key region
	// (reported as skipped, with ErrQuickSkip).
	Quick bool
	// WallClock times the compute-only ops (cpuOp: the kernel and step figures) by wall time
	// instead of their thread's CPU time.
	WallClock bool
}

// defaultConfig is the full run: 11 rounds (odd, so the median is a sample)
// of batches of at least 20 ms.
func defaultConfig() runConfig { return runConfig{Rounds: 11, Target: 20 * time.Millisecond} }

// quickConfig keeps the baselines' share of a run to a few seconds, for
// `shmsteer bench --quick` and CI.
func quickConfig() runConfig { return runConfig{Rounds: 7, Target: 5 * time.Millisecond, Quick: true} }

func (c runConfig) wants(name string) bool {
	if len(c.Only) == 0 {
		return true
	}
	for _, p := range c.Only {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// maxBatch bounds calibration: an op so cheap that 2^30 runs stay under the
// target is being elided by the compiler, not measured.
const maxBatch = 1 << 30

// calibrate finds a batch size whose run takes at least target. The last
// batch it runs doubles as the contender's warm-up.
func calibrate(op Op, target time.Duration) (int, error) {
	n := 1
	for {
		d, err := op(n)
		if err != nil {
			return 0, err
		}
		if d >= target || n >= maxBatch {
			return n, nil
		}
		next := 100 * n
		if d > 0 {
			// Aim 20% past the target so the next try usually ends it.
			next = int(1.2 * float64(n) * float64(target) / float64(d))
		}
		n = min(max(next, 2*n), 100*n, maxBatch)
	}
}

// median returns the middle value (mean of the two middle values for an even
// count); 0 for no values.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// quantile returns the q-quantile (0 ≤ q ≤ 1) by linear interpolation
// between the closest ranks; 0 for no values.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}

// progress prints "[i/total] name round r/R" over itself on one line.
type progress struct {
	w     io.Writer
	i     int
	total int
}

func (p *progress) show(name, what string) {
	if p == nil || p.w == nil {
		return
	}
	fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s %s", p.i, p.total, name, what)
}

func (p *progress) done() {
	if p == nil || p.w == nil {
		return
	}
	fmt.Fprint(p.w, "\r\033[K")
}

// live is a contender during a run.
type live struct {
	name    string
	op      Op
	n       int
	nsPerOp []float64
	skipped string
}

// alternateAll measures the contenders of one group in a single run: after each
// contender's setup and calibration, round r measures every live contender
// once, in order (A B C A B C …), so drift of a noisy machine lands on all of
// them alike. It returns one figure per contender, in input order, skipped
// ones carrying the reason, and warnings from failed cleanups. Cleanups run
// before it returns, even when an op panics.
func alternateAll(cfg runConfig, cs ...contender) (figs []figure, warnings []string) {
	return alternate(cfg, nil, cs, false)
}

// alternate is alternateAll; with rotate, round r starts at the r-th contender (A B C, B C A,
// C A B, …), so no contender always runs first in its round and a pair's order flips from
// round to round. With three or more, the order within a round stays cyclic: a contender runs
// right after the same one (a cache-polluting Go loop, another process) in every round but the
// one it starts.
func alternate(cfg runConfig, prog *progress, cs []contender, rotate bool) (figs []figure, warnings []string) {
	ls := make([]*live, len(cs))
	type named struct {
		name string
		f    func() error
	}
	var cleanups []named
	defer func() {
		// Reverse order, as defers would: a later setup may share a resource
		// set up earlier.
		for i := len(cleanups) - 1; i >= 0; i-- {
			if err := cleanups[i].f(); err != nil {
				// The timings already taken stand, but a failed cleanup (a child
				// that would not exit) must not pass silently.
				warnings = append(warnings, fmt.Sprintf("%s: cleanup: %v", cleanups[i].name, err))
			}
		}
	}()
	for i, c := range cs {
		l := &live{name: c.Name}
		ls[i] = l
		if prog != nil {
			prog.i++
			prog.show(c.Name, "setup")
		}
		op, cleanup, err := safeSetup(c.Setup)
		if cleanup != nil {
			cleanups = append(cleanups, named{c.Name, cleanup})
		}
		if err != nil {
			l.skipped = err.Error()
			continue
		}
		prog.show(c.Name, "calibrate")
		n, err := calibrate(op, cfg.Target)
		if err != nil {
			l.skipped = fmt.Sprintf("calibration: %v", err)
			continue
		}
		l.op, l.n = op, n
	}
	for r := range cfg.Rounds {
		for i := range ls {
			l := ls[i]
			if rotate {
				l = ls[(i+r)%len(ls)]
			}
			if l.skipped != "" {
				continue
			}
			prog.show(l.name, fmt.Sprintf("round %d/%d", r+1, cfg.Rounds))
			d, err := l.op(l.n)
			switch {
			case err != nil:
				l.skipped = fmt.Sprintf("round %d: %v", r+1, err)
			case d <= 0:
				l.skipped = fmt.Sprintf("round %d: %v", r+1, ErrBadOp)
			default:
				l.nsPerOp = append(l.nsPerOp, float64(d.Nanoseconds())/float64(l.n))
			}
		}
	}
	for _, l := range ls {
		f := figure{Name: l.name, Unit: unitOf(l.name), Skipped: l.skipped}
		if l.skipped == "" {
			if len(l.nsPerOp) == 0 {
				f.Skipped = "no rounds run"
			} else {
				f.Value = median(l.nsPerOp)
				f.Rounds, f.Batch, f.Samples = len(l.nsPerOp), l.n, l.nsPerOp
				f.Spread = (quantile(l.nsPerOp, 0.75) - quantile(l.nsPerOp, 0.25)) / f.Value
			}
		}
		figs = append(figs, f)
	}
	return figs, warnings
}

// safeSetup turns a panicking setup into a skipped contender: a half-written
// engine hook must not take the baselines down with it.
func safeSetup(s setupFunc) (op Op, cleanup func() error, err error) {
	if s == nil {
		return nil, nil, ErrNotWired
	}
	defer func() {
		if r := recover(); r != nil {
			op, err = nil, fmt.Errorf("setup panicked: %v", r)
		}
	}()
	op, cleanup, err = s()
	if err == nil && op == nil {
		err = ErrNotWired
	}
	return op, cleanup, err
}
