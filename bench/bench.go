package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/term"
)

// sources are the shmsteer contenders of a run: engineSources in a real one,
// fakes in the tests. A nil field is reported as skipped ("not wired"),
// never estimated. Setups run in this (owner) process; readers that must be
// separate processes use [startChild].
type sources struct {
	// KeysGet measures keys.get.shmsteer_ns: a client Get of a 36-char key
	// from a child process attached to the owner's region, round-robin over
	// the numKeys hot keys. Typically: create the region here,
	// startChild(role, regionPath), return proc.Op("get") and a cleanup
	// closing the child and the region. Compared with keys.get.gomap_ns.
	KeysGet setupFunc
	// KeysGetCold measures keys.get.cold.shmsteer_ns: the same Get, uniform
	// random (coldIndex) over the coldNumKeys keys of coldKeys, compared with
	// a Go map of the same keys (keys.get.cold.gomap_ns). Skipped in --quick.
	KeysGetCold setupFunc
	// KeysSetClient measures keys.set.client_ns (a Set from a client, child
	// process as for KeysGet); compared with keys.set.syncmanager_ns.
	KeysSetClient setupFunc
	// KeysSetOwner times owner Sets one by one (in-process, membarrier passes
	// included) for keys.set.owner_ns (p50) and keys.set.owner_p99_ns.
	KeysSetOwner latencySetup
	// KeysReaderProcs starts k reader children on one region; each serves op
	// "get" (round-robin over the hot keys, as KeysGet). They yield
	// keys.get.throughput_2readers_x: reads per second of two readers started
	// at one wall-clock instant, over one reader's (see throughputContenders).
	KeysReaderProcs func(k int) (procs []*proc, cleanup func() error, err error)
	// AddRows runs the best add kernel (kernels.AddRows) iters times, called
	// from a Go loop as the C variants are called from a C loop (AddRowsC), and
	// measured against the Go loop, numpy and C on the same shapes as
	// kernels.add.<size>.shmsteer_ns.
	AddRows addRepeatFunc
	// AddRowsC runs C variant (one of CVariants) iters times in one call
	// (internal/ccompare.AddRowsVariantRepeat), so C alternates with the other
	// add contenders round by round without paying a cgo transition per add.
	// kernels.add.<size>.c_ns is the fastest variant at that size.
	AddRowsC  func(variant string, h []float32, d int, s float32, v []float32, iters int) error
	CVariants []string
	// StepMixed and StepKernel measure one prefill step (T = 256 rows, one
	// site): steer.step.prefill.mixed_ns and steer.step.prefill.kernel_ns.
	StepMixed  setupFunc
	StepKernel setupFunc
	// StepDecode* measure a whole decode step (64 requests × 1 row, every
	// site of 32 layers × 5 hooks): steer.step.decode.{mixed,kernel}_ns with
	// every request steered, steer.step.decode.{sparse,sparse_kernel}_ns with 4;
	// each kernel reads its step's own vectors in place (see decodebench.go).
	StepDecodeMixed, StepDecodeKernel  setupFunc
	StepDecodeSparse, StepSparseKernel setupFunc
	// StepDecodeMixedApply and StepDecodeSparseApply are the same steps with the batch passed
	// to Apply at every site instead of bound once (Stepper.Bind, ApplyBound):
	// steer.step.decode.{mixed,sparse}_apply_ns, diagnostics beside the goal figures.
	StepDecodeMixedApply, StepDecodeSparseApply setupFunc
	// StepDecodeScattered is steer.step.decode.scattered_kernel_ns, the bare row adds of the
	// decode step's vectors laid out request-major, as the engine laid them out before the
	// column pool (a diagnostic beside the kernel figure: see decodebench.go).
	StepDecodeScattered setupFunc
	// Memory returns mem.overhead_ratio (unit "x").
	Memory func() (overhead float64, err error)
	// TP8 returns mem.tp8_ratio, measured with 8 real rank processes, and a
	// note saying how.
	TP8 func() (ratio float64, note string, err error)
}

// latencySetup prepares an operation timed call by call: run performs
// len(lat) operations and stores each one's duration in lat.
type latencySetup func() (run func(lat []time.Duration) error, cleanup func() error, err error)

// ErrQuickSkip marks a figure --quick leaves out (1 GiB buffers, a 1M-key region).
var ErrQuickSkip = errors.New("skipped in --quick")

// runFigures measures every wanted figure, group by group (contenders alternate
// within a group), and returns the finished report.
func runFigures(cfg runConfig, src sources) *report {
	cfg.Rounds = max(cfg.Rounds, 1)
	wallClock.Store(cfg.WallClock)
	prog := &progress{w: cfg.Progress}
	defer prog.done()
	gs := &groupSet{cfg: cfg, prog: prog}
	gs.addKeys(src)
	np, numpyWanted := gs.addKernels(src)
	gs.addSteps(src)
	memNames := filter(cfg, "mem.overhead_ratio", "mem.tp8_ratio")
	prog.total += len(memNames)

	if numpyWanted {
		// One numpy process serves the sizes up to 64m: hold it across the
		// size groups rather than restarting Python for each. A start failure
		// is cached and becomes each numpy figure's skip reason.
		if _, release, err := np.acquire(); err == nil {
			defer func() { _ = release() }()
		}
	}
	rep := gs.measure()
	rep.Add(memFigures(prog, src, memNames)...)
	rep.Finish()
	return rep
}

// runGroup is contenders measured alternately, round by round.
type runGroup struct {
	cs     []contender
	post   func([]figure) []figure // turns the group's raw figures into the reported ones
	rotate bool                    // see alternate
}

// groupSet collects a run's wanted contenders into groups, in the order they run.
type groupSet struct {
	cfg    runConfig
	prog   *progress
	groups []runGroup
}

// keepGroup adds a group of the wanted contenders among cs (none: no group) and returns them.
func (g *groupSet) keepGroup(rotate bool, post func([]figure) []figure, cs ...contender) []contender {
	var out []contender
	for _, c := range cs {
		if g.cfg.wants(baseName(c.Name)) {
			out = append(out, c)
		}
	}
	if len(out) > 0 {
		g.groups = append(g.groups, runGroup{out, post, rotate})
		g.prog.total += len(out)
	}
	return out
}

func (g *groupSet) keepWith(post func([]figure) []figure, cs ...contender) []contender {
	return g.keepGroup(false, post, cs...)
}

func (g *groupSet) keep(cs ...contender) []contender { return g.keepWith(nil, cs...) }

// keepRotated adds a group whose order rotates every round: the step pairs and the kernel
// sizes (the 1 GiB size keeps its copy reference right after the add it is a fraction of).
func (g *groupSet) keepRotated(cs ...contender) []contender { return g.keepGroup(true, nil, cs...) }

// quickSkip is s, or with --quick a setup that skips with ErrQuickSkip naming what.
func (g *groupSet) quickSkip(s setupFunc, what string) setupFunc {
	if !g.cfg.Quick {
		return s
	}
	return func() (Op, func() error, error) { return nil, nil, fmt.Errorf("%w (%s)", ErrQuickSkip, what) }
}

// addKeys adds the key registry groups: lookups and writes against their controls, cold
// lookups, and reader throughput.
func (g *groupSet) addKeys(src sources) {
	sm, rd, pk := newSyncManager(), &redisShared{}, newPythonKeys()
	owner := newLatency(g.cfg, "keys.set.owner_ns", "keys.set.owner_p99_ns", src.KeysSetOwner)
	g.keepWith(thenPost(owner.post, pk.notePaths(map[string]string{"keys.get.python_ns": "get", "keys.get.python_ctypes_ns": "getctypes"})),
		contender{"keys.get.gomap_ns", gomapSetup},
		contender{"keys.get.syncmanager_ns", sm.opOf("get")},
		contender{"keys.set.syncmanager_ns", sm.opOf("set")},
		contender{"keys.get.redis_ns", rd.setup("get")},
		contender{"keys.set.redis_ns", rd.setup("set")},
		contender{"keys.get.shmsteer_ns", src.KeysGet},
		contender{"keys.get.python_ns", pk.opOf("get")}, // capi.go
		contender{"keys.get.python_ctypes_ns", pk.opOf("getctypes")},
		contender{"keys.get.capi_ns", capiKeysSetup("get")},
		contender{"keys.get.capi_many_ns", capiKeysSetup("getmany")},
		contender{"keys.set.client_ns", src.KeysSetClient},
		owner.contender(),
	)
	g.keep(
		contender{"keys.get.cold.gomap_ns", g.quickSkip(gomapColdSetup, "a map of 1M keys")},
		contender{"keys.get.cold.shmsteer_ns", g.quickSkip(src.KeysGetCold, "a region of 1M keys")},
	)
	// The shmsteer readers and their Go-map control alternate in one group, so
	// the machine's load at the time lands on both.
	const tpReaders, tpGomaps = "keys.get.throughput_2readers_x", "keys.get.throughput_2gomaps_x"
	g.keepWith(throughputFigures(tpReaders, tpGomaps), append(
		throughputContenders(tpReaders, src.KeysReaderProcs),
		throughputContenders(tpGomaps, gomapProcs)...)...)
}

// addKernels adds two groups per kernel size, and returns the numpy process shared by the
// sizes up to 64m and whether any of them wants it.
func (g *groupSet) addKernels(src sources) (np *shared, numpyWanted bool) {
	np = newNumpy(sharedNumpySizes()...)
	for _, k := range kernelSizes {
		pre := "kernels.add." + k.Tag + "."
		bufs := &kernelBuffers{k: k}
		npk := np
		if k == hugeKernelSize {
			npk = newNumpy(k) // its own process, alive only while the 1g group runs
		}
		// The goal's contenders (shmsteer and the gcc variants) alternate among themselves; the
		// Go loop and numpy, reference figures, in a group of their own right after. numpy runs
		// in another process on buffers of its own, and in one group with them whatever ran
		// after it started with h evicted: on a Xeon with a 260 MiB L3, where h of 64 MiB stays
		// in the cache between calls, the contender after numpy measured 1.3-1.8x the gcc
		// variants' best at 64m, and the variants got faster the further they ran from it.
		refs := []contender{
			{pre + "goloop_ns", addSetup(bufs, repeated(goLoopAdd))},
			{pre + "numpy_ns", npk.opOf("add." + k.Tag)},
		}
		cs := []contender{{pre + "shmsteer_ns", addSetup(bufs, src.AddRows)}}
		variants := src.CVariants
		if len(variants) == 0 {
			variants = []string{""} // reported as not wired
		}
		if k == hugeKernelSize {
			// Right after the add they are compared with, in every round.
			var dst []float32
			cs = append(cs, contender{pre + "bw_fraction" + variantSep + "copy", copySetup(bufs, &dst, 0)},
				contender{pre + "bw_fraction" + variantSep + "copy64k", copySetup(bufs, &dst, 16<<10)})
		}
		for _, v := range variants {
			cs = append(cs, contender{pre + "c_ns" + variantSep + v, addRepeatSetup(bufs, v, src.AddRowsC)})
		}
		if k == hugeKernelSize {
			for _, group := range [][]contender{cs, refs} {
				for i := range group {
					group[i].Setup = g.quickSkip(group[i].Setup, "1 GiB buffers")
				}
			}
		}
		g.keepGroup(k != hugeKernelSize, kernelFigures(k), cs...)
		if len(g.keepGroup(k != hugeKernelSize, kernelFigures(k), refs...)) > 0 && g.cfg.wants(pre+"numpy_ns") && k != hugeKernelSize {
			numpyWanted = true
		}
	}
	return np, numpyWanted
}

// addSteps adds the step groups: prefill, decode with every request steered, sparse decode.
func (g *groupSet) addSteps(src sources) {
	g.keepRotated(
		contender{"steer.step.prefill.mixed_ns", src.StepMixed},
		contender{"steer.step.prefill.kernel_ns", src.StepKernel},
	)
	g.keepRotated(
		contender{"steer.step.decode.mixed_ns", src.StepDecodeMixed},
		contender{"steer.step.decode.kernel_ns", src.StepDecodeKernel},
		contender{"steer.step.decode.mixed_apply_ns", src.StepDecodeMixedApply},
		contender{"steer.step.decode.scattered_kernel_ns", src.StepDecodeScattered},
	)
	g.keepRotated(
		contender{"steer.step.decode.sparse_ns", src.StepDecodeSparse},
		contender{"steer.step.decode.sparse_kernel_ns", src.StepSparseKernel},
		contender{"steer.step.decode.sparse_apply_ns", src.StepDecodeSparseApply},
	)
}

// measure runs the groups in order and reports their figures and warnings.
func (g *groupSet) measure() *report {
	rep := &report{}
	for gi, grp := range g.groups {
		figs, warns := alternate(g.cfg, g.prog, grp.cs, grp.rotate)
		if grp.post != nil {
			figs = grp.post(figs)
		}
		for i := range figs {
			figs[i].Group = gi + 1
		}
		rep.Add(figs...)
		rep.Warnings = append(rep.Warnings, warns...)
		rep.Warnings = append(rep.Warnings, throughputPlausible(figs)...)
	}
	return rep
}

func filter(cfg runConfig, names ...string) []string {
	var out []string
	for _, n := range names {
		if cfg.wants(n) {
			out = append(out, n)
		}
	}
	return out
}

func memFigures(prog *progress, src sources, names []string) []figure {
	var figs []figure
	for _, n := range names {
		prog.i++
		prog.show(n, "running")
		f := figure{Name: n, Unit: unitOf(n)}
		var err error
		switch {
		case n == "mem.overhead_ratio" && src.Memory != nil:
			f.Value, err = src.Memory()
		case n == "mem.tp8_ratio" && src.TP8 != nil:
			f.Value, f.Note, err = src.TP8()
		default:
			err = ErrNotWired
		}
		if err != nil {
			f.Skipped, f.Value, f.Note = err.Error(), 0, ""
		}
		figs = append(figs, f)
	}
	return figs
}

// Options are the flags of `shmsteer bench` ([BindFlags] defines them).
type Options struct {
	Quick  bool   // short batches and few rounds
	JSON   string // write the measured figures as a JSON array here
	Plot   string // write a bar chart here (.png or .svg)
	Rounds int    // alternation rounds per contender; 0 for the default
	Only   string // comma-separated figure-name prefixes to run
	// WallClock times the kernel and step figures by wall time, not their thread's CPU time.
	WallClock bool
	// Summarize, comma-separated JSON files of earlier runs (--json), prints their Markdown
	// summary (Summarize) instead of running anything.
	Summarize string
}

// BindFlags defines the flags of `shmsteer bench` on fs and returns where they land.
func BindFlags(fs *pflag.FlagSet) *Options {
	o := &Options{}
	fs.BoolVar(&o.Quick, "quick", false, "short batches and few rounds (a few seconds for the baselines)")
	fs.StringVar(&o.JSON, "json", "", "write the measured figures as a JSON array to `FILE`")
	fs.StringVar(&o.Plot, "plot", "", "write a bar chart to `FILE` (.png or .svg)")
	fs.IntVar(&o.Rounds, "rounds", 0, "alternation rounds per contender (default 11, 7 with --quick)")
	fs.StringVar(&o.Only, "only", "", "comma-separated figure-name `PREFIXES` to run (e.g. keys.,kernels.add.16k)")
	fs.BoolVar(&o.WallClock, "wall-clock", false, "time the kernel and step figures by wall time instead of their thread's CPU time")
	fs.StringVar(&o.Summarize, "summarize", "", "run nothing: print the Markdown summary (goals met, medians) of the comma-separated JSON `FILES` of earlier --json runs")
	return o
}

// ErrUsage reports flag values that cannot run (found before anything runs).
var ErrUsage = errors.New("shmsteer: bench: bad flags")

// Main is `shmsteer bench`: it runs the suite per o and prints the table to stdout, progress to
// stderr. It returns an error wrapping [ErrUsage] for bad flags, before anything runs, or the
// error writing the table or an output file. Skipped figures do not fail the run.
func Main(o Options, stdout, stderr io.Writer) error {
	return runMain(o, engineSources(), stdout, stderr)
}

func runMain(o Options, src sources, stdout, stderr io.Writer) error {
	if o.Summarize != "" {
		if o.Quick || o.JSON != "" || o.Plot != "" || o.Rounds != 0 || o.Only != "" || o.WallClock {
			return fmt.Errorf("%w: --summarize runs nothing; it takes no other flag", ErrUsage)
		}
		var files []string
		for _, f := range strings.Split(o.Summarize, ",") {
			if f = strings.TrimSpace(f); f != "" {
				files = append(files, f)
			}
		}
		return summarizeFiles(stdout, files)
	}
	cfg, err := o.config()
	if err != nil {
		return err
	}
	cfg.Progress = progressWriter(stderr)
	start := time.Now()
	rep := runFigures(cfg, src)
	clock := "thread CPU time"
	if cfg.WallClock {
		clock = "wall time"
	}
	fmt.Fprintf(stdout, "# shmsteer bench: %d rounds per contender, batches >= %v, GOMAXPROCS=%d, %s; kernel and step figures in %s (numpy's and child processes' in wall time); took %.1fs\n",
		cfg.Rounds, cfg.Target, runtime.GOMAXPROCS(0), runtime.Version(), clock, time.Since(start).Seconds())
	var errs []error
	if err := rep.WriteTable(stdout); err != nil {
		errs = append(errs, err)
	}
	if o.JSON != "" {
		if err := writeFile(o.JSON, rep.WriteJSON); err != nil {
			errs = append(errs, fmt.Errorf("--json: %w", err))
		}
	}
	if o.Plot != "" {
		if err := rep.Plot(o.Plot); err != nil {
			errs = append(errs, fmt.Errorf("--plot: %w", err))
		}
	}
	return errors.Join(errs...)
}

// config checks o and turns it into a runConfig.
func (o Options) config() (runConfig, error) {
	if o.Rounds < 0 {
		return runConfig{}, fmt.Errorf("%w: --rounds %d is negative", ErrUsage, o.Rounds)
	}
	cfg := defaultConfig()
	if o.Quick {
		cfg = quickConfig()
	}
	if o.Rounds > 0 {
		cfg.Rounds = o.Rounds
	}
	cfg.WallClock = o.WallClock
	if o.Plot != "" {
		// Checked before the run, not after it: the format follows the extension.
		if ext := strings.ToLower(filepath.Ext(o.Plot)); ext != ".png" && ext != ".svg" {
			return runConfig{}, fmt.Errorf("%w: --plot %q: the file name must end in .png or .svg", ErrUsage, o.Plot)
		}
	}
	if o.Only != "" {
		for _, p := range strings.Split(o.Only, ",") {
			if p = strings.TrimSpace(p); p != "" {
				cfg.Only = append(cfg.Only, p)
			}
		}
		if len(cfg.Only) == 0 || len(filter(cfg, reportOrder()...)) == 0 {
			return runConfig{}, fmt.Errorf("%w: --only %q matches no figure; figure names: %s", ErrUsage, o.Only, strings.Join(reportOrder(), ", "))
		}
	}
	return cfg, nil
}

// progressWriter is where the progress line goes: w itself on a terminal,
// where each update rewrites the line in place, and otherwise a writer that
// drops the terminal escapes and puts each update on a line of its own (logs,
// pipes, CI).
func progressWriter(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return w
	}
	return plainProgress{w}
}

// plainProgress turns the progress line's "\r\033[K" + text updates into
// plain lines.
type plainProgress struct{ w io.Writer }

func (p plainProgress) Write(b []byte) (int, error) {
	text := strings.ReplaceAll(strings.ReplaceAll(string(b), "\033[K", ""), "\r", "")
	if text == "" {
		return len(b), nil
	}
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	if _, err := io.WriteString(p.w, text); err != nil {
		return 0, err
	}
	return len(b), nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
