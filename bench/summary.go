package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
)

// Summaries of several runs: `shmsteer bench --summarize a.json,b.json,c.json` reads the JSON
// of runs made with --json and prints, as Markdown, each goal's figure per run with its median
// and in how many runs it was met, then every figure's median, per-run values and ratio. The
// README's performance tables are this output.

// goal is one of the engine's performance targets: a figure's ratio to its baseline (Ratio) or
// its value, at most Max.
type goal struct {
	Text   string  // what the goal says, as the README's table names it
	Figure string  // the figure it is read from
	Ratio  bool    // compare the figure's ratio to its baseline, else its value
	Max    float64 // the bound, in the figure's unit (ns for _ns figures)
}

// goals are the targets the bench checks (issue 21's list), in the README's order.
var goals = []goal{
	{"key Get from a worker ≤ 1.5× a Go map (hot)", "keys.get.shmsteer_ns", true, 1.5},
	{"key Get ≤ 1.3× a Go map, cold (uniform over 1M keys)", "keys.get.cold.shmsteer_ns", true, 1.3},
	{"C key Get ≤ 1.5× the Go Get, one call per key", "keys.get.capi_ns", true, 1.5},
	{"Python key Get ≤ 500 ns", "keys.get.python_ns", false, 500},
	{"owner Set p99 ≤ 3 µs", "keys.set.owner_p99_ns", false, 3000},
	{"add kernel ≤ 1.02× the best gcc variant, 16 KiB", "kernels.add.16k.shmsteer_ns", true, 1.02},
	{"add kernel ≤ 1.02×, 256 KiB", "kernels.add.256k.shmsteer_ns", true, 1.02},
	{"add kernel ≤ 1.02×, 4 MiB", "kernels.add.4m.shmsteer_ns", true, 1.02},
	{"add kernel ≤ 1.02×, 64 MiB", "kernels.add.64m.shmsteer_ns", true, 1.02},
	{"add kernel ≤ 1.02×, 1 GiB", "kernels.add.1g.shmsteer_ns", true, 1.02},
	{"prefill step ≤ 1.05× its kernel", "steer.step.prefill.mixed_ns", true, 1.05},
	{"decode step ≤ 1.05× its kernel", "steer.step.decode.mixed_ns", true, 1.05},
	{"sparse decode step ≤ 1.05× its kernel", "steer.step.decode.sparse_ns", true, 1.05},
	{"8 real ranks hold ≤ 0.15× the bytes of 8 private copies", "mem.tp8_ratio", false, 0.15},
	{"region overhead ≤ 1.10", "mem.overhead_ratio", false, 1.10},
}

// ErrBadRun reports a --summarize file that is not the JSON of a run (--json's output).
var ErrBadRun = errors.New("shmsteer: bench: not a run's JSON")

// maxRunBytes bounds a run's JSON file; a run holds about a hundred figures.
const maxRunBytes = 16 << 20

// readRun decodes the JSON --json wrote: an array of figures, each with a name and a finite
// value; anything else is ErrBadRun.
func readRun(r io.Reader) ([]figure, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxRunBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxRunBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrBadRun, maxRunBytes)
	}
	var figs []figure
	if err := json.Unmarshal(b, &figs); err != nil {
		return nil, fmt.Errorf("%w: %v (write one with shmsteer bench --json FILE)", ErrBadRun, err)
	}
	if figs == nil {
		return nil, fmt.Errorf("%w: not an array of figures", ErrBadRun)
	}
	for i, f := range figs {
		bad := func(what string) error { return fmt.Errorf("%w: figure %d (%q) %s", ErrBadRun, i, f.Name, what) }
		switch {
		case f.Name == "":
			return nil, bad("has no name")
		case math.IsNaN(f.Value) || math.IsInf(f.Value, 0) || math.IsNaN(f.Ratio) || math.IsInf(f.Ratio, 0):
			return nil, bad("has a value that is not a finite number")
		case f.Ratio != 0 && f.Baseline == "":
			return nil, bad("has a ratio without a baseline")
		}
	}
	return figs, nil
}

// summarize writes the Markdown summary of runs (each as readRun returns it): the goal table
// and the figure table.
func summarize(w io.Writer, runs [][]figure) error {
	if len(runs) == 0 {
		return fmt.Errorf("%w: no runs to summarize", ErrUsage)
	}
	by := make([]map[string]figure, len(runs))
	names := map[string]bool{}
	for i, run := range runs {
		by[i] = map[string]figure{}
		for _, f := range run {
			by[i][f.Name] = f
			names[f.Name] = true
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| goal | per run | median | met (runs) |\n|---|---|---|---|\n")
	for _, g := range goals {
		var vals []float64
		var cells []string
		var unit figure // a run's figure, for the median's unit: the first run may lack it
		met := 0
		for i := range runs {
			f, ok := by[i][g.Figure]
			v := f.Value
			if g.Ratio {
				ok, v = ok && f.Ratio != 0, f.Ratio
			}
			if !ok {
				cells = append(cells, "—")
				continue
			}
			unit = f
			vals = append(vals, v)
			cells = append(cells, goalValue(g, f, v))
			if v <= g.Max {
				met++
			}
		}
		med := "—"
		if len(vals) > 0 {
			med = goalValue(g, unit, median(vals))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d of %d |\n", g.Text, strings.Join(cells, ", "), med, met, len(vals))
	}
	fmt.Fprintf(&b, "\n| figure | median of %d runs | per-run values | baseline | ratio (median) |\n|---|---|---|---|---|\n", len(runs))
	order := slices.Collect(maps.Keys(names))
	slices.SortFunc(order, func(a, c string) int {
		if d := rank(a) - rank(c); d != 0 {
			return d
		}
		return strings.Compare(a, c)
	})
	for _, n := range order {
		var vals, ratios []float64
		var cells []string
		var any figure
		base := ""
		for i := range runs {
			f, ok := by[i][n]
			if !ok {
				cells = append(cells, "—")
				continue
			}
			any = f
			vals = append(vals, f.Value)
			cells = append(cells, humanValue(f, f.Value))
			if f.Ratio != 0 {
				ratios = append(ratios, f.Ratio)
				base = f.Baseline
			}
		}
		ratio := ""
		if len(ratios) > 0 {
			ratio = fmt.Sprintf("%.3f", median(ratios))
			base = "`" + base + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", n, humanValue(any, median(vals)), strings.Join(cells, ", "), base, ratio)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// goalValue prints v, a goal's ratio or value, as the goal table shows it.
func goalValue(g goal, f figure, v float64) string {
	if g.Ratio {
		return fmt.Sprintf("%.3f", v)
	}
	return humanValue(f, v)
}

// humanValue prints v in f's unit: times in ns, µs or ms, other units with three decimals and ×.
func humanValue(f figure, v float64) string {
	if f.Unit != "ns/op" {
		return fmt.Sprintf("%.3f×", v)
	}
	switch {
	case v < 1000:
		return fmt.Sprintf("%.1f ns", v)
	case v < 1e6:
		return fmt.Sprintf("%.2f µs", v/1e3)
	}
	return fmt.Sprintf("%.2f ms", v/1e6)
}

// summarizeFiles reads the runs in files and writes their summary.
func summarizeFiles(w io.Writer, files []string) error {
	var runs [][]figure
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("shmsteer: bench: --summarize: %w", err)
		}
		run, err := readRun(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%w (in %s)", err, name)
		}
		runs = append(runs, run)
	}
	return summarize(w, runs)
}
