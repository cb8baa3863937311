package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Sources are the shmsteer contenders, plugged in by cmd/shmsteer; bench
// itself does not import the engine. A nil field is reported as skipped
// ("not wired"), never estimated. Setups run in this (owner) process;
// readers that must be separate processes use [StartChild].
type Sources struct {
	// KeysGet measures keys.get.shmsteer_ns: a client Get of a 36-char key
	// from a child process attached to the owner's region. Typically: create
	// the region here, StartChild(role, regionPath), return proc.Op("get")
	// and a cleanup closing the child and the region. Compared with
	// keys.get.syncmanager_ns.
	KeysGet Setup
	// KeysSetClient measures keys.set.client_ns (a Set from a client, child
	// process as for KeysGet) and KeysSetOwner keys.set.owner_ns (a Set in
	// the owner, in-process: wrap with GoOp). Compared with
	// keys.set.syncmanager_ns.
	KeysSetClient Setup
	KeysSetOwner  Setup
	// KeysReaders starts k reader children on one region and returns each
	// one's get op; it yields keys.get.scaling_2readers with k = 2, defined
	// as the per-op time of a reader while a second reader runs its batch at
	// the same time, over the per-op time of a reader alone: 1.0 is perfect
	// scaling, 2.0 fully serialized readers.
	KeysReaders func(k int) (ops []Op, cleanup func() error, err error)
	// AddRows is the best add kernel (kernels.AddRows), measured against the
	// Go loop and numpy on the same shapes as kernels.add.<size>.shmsteer_ns.
	AddRows AddFunc
	// AddRowsC runs the gcc -O3 -march=native add iters times in one call
	// (kernels/ccompare.AddRowsRepeat), so C alternates with the other add
	// contenders round by round without paying a cgo transition per add.
	AddRowsC func(h []float32, d int, s float32, v []float32, iters int) error
	// StepMixed and StepKernel measure one steering step, for
	// steer.step.mixed_ns and steer.step.kernel_ns.
	StepMixed  Setup
	StepKernel Setup
	// Memory returns mem.overhead_ratio and mem.tp8_ratio (unit "x").
	Memory func() (overhead, tp8 float64, err error)
}

// Run measures every wanted figure, group by group (contenders alternate
// within a group), and returns the finished report.
func Run(cfg Config, src Sources) *Report {
	cfg.Rounds = max(cfg.Rounds, 1)
	prog := &progress{w: cfg.Progress}
	defer prog.done()
	rep := &Report{}
	var groups [][]Contender
	keep := func(cs ...Contender) []Contender {
		var out []Contender
		for _, c := range cs {
			if cfg.wants(c.Name) {
				out = append(out, c)
			}
		}
		if len(out) > 0 {
			groups = append(groups, out)
			prog.total += len(out)
		}
		return out
	}

	sm, rd := newSyncManager(), &redisShared{}
	keep(
		Contender{"keys.get.gomap_ns", gomapSetup},
		Contender{"keys.get.syncmanager_ns", sm.opOf("get")},
		Contender{"keys.set.syncmanager_ns", sm.opOf("set")},
		Contender{"keys.get.redis_ns", rd.setup("get")},
		Contender{"keys.set.redis_ns", rd.setup("set")},
		Contender{"keys.get.shmsteer_ns", src.KeysGet},
		Contender{"keys.set.client_ns", src.KeysSetClient},
		Contender{"keys.set.owner_ns", src.KeysSetOwner},
	)
	const scalingName = "keys.get.scaling_2readers"
	scaling := keep(scalingContenders(scalingName, src.KeysReaders)...)
	np := newNumpy()
	numpyWanted := false
	for _, k := range KernelSizes {
		pre := "kernels.add." + k.Tag + "."
		if len(keep(
			Contender{pre + "goloop_ns", addSetup(k, goLoopAdd)},
			Contender{pre + "numpy_ns", np.opOf("add." + k.Tag)},
			Contender{pre + "shmsteer_ns", addSetup(k, src.AddRows)},
			Contender{pre + "c_ns", addRepeatSetup(k, src.AddRowsC)},
		)) > 0 && cfg.wants(pre+"numpy_ns") {
			numpyWanted = true
		}
	}
	keep(
		Contender{"steer.step.mixed_ns", src.StepMixed},
		Contender{"steer.step.kernel_ns", src.StepKernel},
	)
	memNames := filter(cfg, "mem.overhead_ratio", "mem.tp8_ratio")
	prog.total += len(memNames)

	if numpyWanted {
		// One numpy process serves all sizes: hold it across the size groups
		// rather than restarting Python for each. A start failure is cached
		// and becomes each numpy figure's skip reason.
		if _, release, err := np.acquire(); err == nil {
			defer func() { _ = release() }()
		}
	}
	for _, g := range groups {
		if len(scaling) > 0 && g[0].Name == scaling[0].Name {
			figs, warns := alternate(cfg, prog, g)
			rep.Add(scalingFigure(scalingName, figs))
			rep.Warnings = append(rep.Warnings, warns...)
			continue
		}
		figs, warns := alternate(cfg, prog, g)
		rep.Add(figs...)
		rep.Warnings = append(rep.Warnings, warns...)
	}
	rep.Add(memFigures(prog, src.Memory, memNames)...)
	rep.Finish()
	return rep
}

func filter(cfg Config, names ...string) []string {
	var out []string
	for _, n := range names {
		if cfg.wants(n) {
			out = append(out, n)
		}
	}
	return out
}

// scalingContenders measures one reader alone and two readers at once,
// alternately; scalingFigure turns the two medians into the ratio.
func scalingContenders(name string, readers func(k int) ([]Op, func() error, error)) []Contender {
	var mu sync.Mutex
	var ops []Op
	one := func() (Op, func() error, error) {
		if readers == nil {
			return nil, nil, ErrNotWired
		}
		rs, cleanup, err := readers(2)
		if err == nil && len(rs) != 2 {
			err = fmt.Errorf("KeysReaders(2) returned %d ops", len(rs))
		}
		if err != nil {
			return nil, cleanup, err
		}
		mu.Lock()
		ops = rs
		mu.Unlock()
		return rs[0], cleanup, nil
	}
	two := func() (Op, func() error, error) {
		mu.Lock()
		defer mu.Unlock()
		if ops == nil {
			return nil, nil, errors.New("readers not started")
		}
		return concurrently(ops[0], ops[1]), nil, nil
	}
	// The cleanup of the first setup ends both readers, after both
	// contenders are done: alternate runs cleanups last, in reverse order.
	return []Contender{{name + "/1", one}, {name + "/2", two}}
}

// concurrently runs a and b at the same time with the same n and returns the
// mean of the durations each measured for itself.
func concurrently(a, b Op) Op {
	return func(n int) (time.Duration, error) {
		var db time.Duration
		var errB error
		var wg sync.WaitGroup
		wg.Go(func() { db, errB = b(n) })
		da, errA := a(n)
		wg.Wait()
		if err := errors.Join(errA, errB); err != nil {
			return 0, err
		}
		return (da + db) / 2, nil
	}
}

func scalingFigure(name string, figs []Figure) Figure {
	f := Figure{Name: name, Unit: unitOf(name)}
	if len(figs) < 2 {
		f.Skipped = "not run"
		return f
	}
	one, two := figs[0], figs[1]
	switch {
	case one.Skipped != "":
		f.Skipped = "1 reader: " + one.Skipped
	case two.Skipped != "":
		f.Skipped = "2 readers: " + two.Skipped
	default:
		f.Value = two.Value / one.Value
		f.Rounds, f.Batch = min(one.Rounds, two.Rounds), one.Batch
		f.Spread = max(one.Spread, two.Spread)
	}
	return f
}

func memFigures(prog *progress, fn func() (float64, float64, error), names []string) []Figure {
	if len(names) == 0 {
		return nil
	}
	err := ErrNotWired
	var vals [2]float64
	if fn != nil {
		prog.show("mem.*", "running")
		vals[0], vals[1], err = fn()
	}
	var figs []Figure
	for _, n := range names {
		prog.i++
		f := Figure{Name: n, Unit: unitOf(n)}
		v := vals[0]
		if n == "mem.tp8_ratio" {
			v = vals[1]
		}
		if err != nil {
			f.Skipped = err.Error()
		} else {
			f.Value = v
		}
		figs = append(figs, f)
	}
	return figs
}

// Main is `shmsteer bench`: it parses args (without the subcommand), runs
// the suite and prints the table to stdout, progress to stderr. It returns
// the exit code: 0, 1 when an output file cannot be written, 2 on bad usage.
// Skipped figures do not fail the run.
func Main(args []string, src Sources, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shmsteer bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "short batches and few rounds (a few seconds for the baselines)")
	jsonPath := fs.String("json", "", "write the measured figures as a JSON array to `FILE`")
	plotPath := fs.String("plot", "", "write a bar chart to `FILE` (.png or .svg)")
	rounds := fs.Int("rounds", 0, "alternation rounds per contender (default 11, 7 with --quick)")
	only := fs.String("only", "", "comma-separated figure-name `PREFIXES` to run (e.g. keys.,kernels.add.16k)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: shmsteer bench [--quick] [--rounds N] [--json FILE] [--plot FILE] [--only PREFIXES]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || *rounds < 0 {
		fs.Usage()
		return 2
	}
	cfg := DefaultConfig()
	if *quick {
		cfg = QuickConfig()
	}
	if *rounds > 0 {
		cfg.Rounds = *rounds
	}
	if *plotPath != "" {
		// Checked before the run, not after it: the format follows the extension.
		if ext := strings.ToLower(filepath.Ext(*plotPath)); ext != ".png" && ext != ".svg" {
			fmt.Fprintf(stderr, "shmsteer bench: --plot %q: the file name must end in .png or .svg\n", *plotPath)
			return 2
		}
	}
	if *only != "" {
		for _, p := range strings.Split(*only, ",") {
			if p = strings.TrimSpace(p); p != "" {
				cfg.Only = append(cfg.Only, p)
			}
		}
		if len(cfg.Only) == 0 || len(filter(cfg, reportOrder()...)) == 0 {
			fmt.Fprintf(stderr, "shmsteer bench: --only %q matches no figure; figure names: %s\n", *only, strings.Join(reportOrder(), ", "))
			return 2
		}
	}
	cfg.Progress = progressWriter(stderr)
	start := time.Now()
	rep := Run(cfg, src)
	fmt.Fprintf(stdout, "# shmsteer bench: %d rounds per contender, batches >= %v, GOMAXPROCS=%d, %s; took %.1fs\n",
		cfg.Rounds, cfg.Target, runtime.GOMAXPROCS(0), runtime.Version(), time.Since(start).Seconds())
	code := 0
	if err := rep.WriteTable(stdout); err != nil {
		fmt.Fprintln(stderr, "shmsteer bench:", err)
		code = 1
	}
	if *jsonPath != "" {
		if err := writeFile(*jsonPath, rep.WriteJSON); err != nil {
			fmt.Fprintln(stderr, "shmsteer bench: --json:", err)
			code = 1
		}
	}
	if *plotPath != "" {
		if err := rep.Plot(*plotPath); err != nil {
			fmt.Fprintln(stderr, "shmsteer bench: --plot:", err)
			code = 1
		}
	}
	return code
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
