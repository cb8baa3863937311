package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// figure is one reported number. Skipped figures carry the reason and no
// value; they are printed but never written to JSON or plotted.
type figure struct {
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Baseline string  `json:"baseline,omitempty"`
	// Ratio is ours over the baseline: the median of the per-round ratios when both were
	// measured round by round in one alternation (the rounds pair up: each pair saw the
	// machine's load of its moment), else Value / the baseline's Value.
	Ratio float64 `json:"ratio,omitempty"`
	// RatioPaired says Ratio is the median of per-round ratios, and RatioSpread is then their
	// interquartile range over that median.
	RatioPaired bool    `json:"ratio_paired,omitempty"`
	RatioSpread float64 `json:"ratio_iqr,omitempty"`
	Skipped     string  `json:"-"`

	// How the value was obtained, for the table only: the rounds it is the
	// median of, the batch size of each round, and the interquartile range
	// over the median, which says how noisy the machine was without letting
	// one preempted round dominate.
	Rounds int     `json:"-"`
	Batch  int     `json:"-"`
	Spread float64 `json:"-"`
	// Samples are the per-round values, in round order, for figures derived
	// round by round from two contenders (a paired ratio).
	Samples []float64 `json:"-"`
	// Group numbers the alternation the figure was measured in (0: none, e.g. a memory
	// figure); a ratio pairs rounds only within one group.
	Group int `json:"-"`

	// WorkingSet is the bytes one call of a kernel contender touches (h plus v; the contender
	// owns them and reuses them every call), so a reader can tell a cache-resident figure from
	// a DRAM-bound one. 0 where it does not apply.
	WorkingSet int64 `json:"working_set_bytes,omitempty"`
	// Note says how a derived figure was obtained (which gcc variant won, the copy bandwidth a
	// fraction is of, the samples a percentile is over).
	Note string `json:"note,omitempty"`
}

// figureNames is the spec of the report: every figure `shmsteer
// bench` knows, in report order. <size> stands for each of [kernelSizes].
var figureNames = []string{
	"keys.get.shmsteer_ns",
	"keys.get.gomap_ns",
	"keys.get.cold.shmsteer_ns",
	"keys.get.cold.gomap_ns",
	"keys.get.throughput_2readers_x",
	"keys.get.throughput_2gomaps_x",
	"keys.set.client_ns",
	"keys.set.owner_ns",
	"keys.set.owner_p99_ns",
	"keys.get.syncmanager_ns",
	"keys.set.syncmanager_ns",
	"keys.get.redis_ns",
	"keys.set.redis_ns",
	"kernels.add.<size>.shmsteer_ns",
	"kernels.add.<size>.c_ns",
	"kernels.add.<size>.goloop_ns",
	"kernels.add.<size>.numpy_ns",
	"kernels.add.1g.bw_fraction",
	"steer.step.prefill.mixed_ns",
	"steer.step.prefill.kernel_ns",
	"steer.step.decode.mixed_ns",
	"steer.step.decode.kernel_ns",
	"steer.step.decode.mixed_apply_ns",
	"steer.step.decode.scattered_kernel_ns",
	"steer.step.decode.sparse_ns",
	"steer.step.decode.sparse_kernel_ns",
	"steer.step.decode.sparse_apply_ns",
	"mem.overhead_ratio",
	"mem.tp8_ratio",
}

// baselines maps each shmsteer figure to the figure it is compared with;
// Ratio = ours / baseline, so below 1 means shmsteer is faster (or smaller).
// Key reads compare with the Go map (the goal: at most 1.5x), key
// writes with the seed design (SyncManager), the add kernel with the best gcc
// variant (the bar for a hand-written kernel) and each step with the bare
// gather-add of the same vectors.
var baselines = map[string]string{
	"keys.get.shmsteer_ns":           "keys.get.gomap_ns",
	"keys.get.cold.shmsteer_ns":      "keys.get.cold.gomap_ns",
	"keys.get.throughput_2readers_x": "keys.get.throughput_2gomaps_x",
	"keys.set.client_ns":             "keys.set.syncmanager_ns",
	"keys.set.owner_ns":              "keys.set.syncmanager_ns",
	"steer.step.prefill.mixed_ns":    "steer.step.prefill.kernel_ns",
	"steer.step.decode.mixed_ns":     "steer.step.decode.kernel_ns",
	// A diagnostic, not a goal: what the engine's layout of the vectors costs the bare kernel.
	"steer.step.decode.scattered_kernel_ns": "steer.step.decode.kernel_ns",
	"steer.step.decode.sparse_ns":           "steer.step.decode.sparse_kernel_ns",
	// Diagnostics, not goals: the steps with the batch passed to Apply at every site.
	"steer.step.decode.mixed_apply_ns":  "steer.step.decode.kernel_ns",
	"steer.step.decode.sparse_apply_ns": "steer.step.decode.sparse_kernel_ns",
}

func init() {
	for _, k := range kernelSizes {
		baselines["kernels.add."+k.Tag+".shmsteer_ns"] = "kernels.add." + k.Tag + ".c_ns"
	}
}

// unitOf derives the unit from the name's suffix, so names and units cannot
// drift apart.
func unitOf(name string) string {
	name = baseName(name)
	switch {
	case strings.HasSuffix(name, "_ns"):
		return "ns/op"
	case strings.HasSuffix(name, "_ratio"), strings.HasSuffix(name, "_x"), strings.HasSuffix(name, "_fraction"):
		return "x"
	}
	return ""
}

// reportOrder expands figureNames: the <size> entries become one entry per
// size and contender, grouped by size, where the first of them stood.
func reportOrder() []string {
	var out, templates []string
	at := -1
	for _, n := range figureNames {
		if strings.Contains(n, "<size>") {
			if at < 0 {
				at = len(out)
			}
			templates = append(templates, n)
			continue
		}
		out = append(out, n)
	}
	var kernel []string
	for _, k := range kernelSizes {
		for _, t := range templates {
			kernel = append(kernel, strings.Replace(t, "<size>", k.Tag, 1))
		}
	}
	return slices.Insert(out, max(at, 0), kernel...)
}

// rank is a figure's place in the report; unknown names go last.
func rank(name string) int {
	if i := slices.Index(reportOrder(), name); i >= 0 {
		return i
	}
	return 1 << 20
}

// report collects the figures of a run.
type report struct {
	Figures  []figure
	Warnings []string
}

// Add appends figures; Finish orders them and fills in ratios.
func (r *report) Add(figs ...figure) { r.Figures = append(r.Figures, figs...) }

// Finish sorts the figures into report order and sets Baseline and Ratio for
// every measured figure whose baseline was measured too; a ratio against a
// skipped baseline is left out rather than guessed.
func (r *report) Finish() {
	slices.SortStableFunc(r.Figures, func(a, b figure) int {
		if c := rank(a.Name) - rank(b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	byName := map[string]figure{}
	for _, f := range r.Figures {
		if f.Skipped == "" {
			byName[f.Name] = f
		}
	}
	for i := range r.Figures {
		f := &r.Figures[i]
		f.Baseline, f.Ratio, f.RatioPaired, f.RatioSpread = "", 0, false, 0
		base, ok := byName[baselines[f.Name]]
		if f.Skipped != "" || !ok || base.Value == 0 {
			continue
		}
		f.Baseline, f.Ratio = base.Name, f.Value/base.Value
		if r, spread, ok := pairedRatio(*f, base); ok {
			f.Ratio, f.RatioPaired, f.RatioSpread = r, true, spread
		}
	}
}

// pairedRatio is the median over rounds of f's value over base's in the same round, and the
// interquartile range of those ratios over it, when both were measured round by round in one
// alternation.
func pairedRatio(f, base figure) (ratio, spread float64, ok bool) {
	n := len(f.Samples)
	if f.Group == 0 || f.Group != base.Group || n == 0 || len(base.Samples) != n {
		return 0, 0, false
	}
	rs := make([]float64, 0, n)
	for r := range n {
		if base.Samples[r] <= 0 {
			return 0, 0, false
		}
		rs = append(rs, f.Samples[r]/base.Samples[r])
	}
	m := median(rs)
	return m, (quantile(rs, 0.75) - quantile(rs, 0.25)) / m, true
}

// Measured returns the figures that have a value, i.e. what the JSON holds.
func (r *report) Measured() []figure {
	var out []figure
	for _, f := range r.Figures {
		if f.Skipped == "" {
			out = append(out, f)
		}
	}
	return out
}

// WriteJSON writes the measured figures as a JSON array, one record per
// figure; skipped figures are absent.
func (r *report) WriteJSON(w io.Writer) error {
	figs := r.Measured()
	if figs == nil {
		figs = []figure{} // "[]", not "null", for readers that expect an array
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(figs)
}

// WriteTable prints the measured figures as an aligned table, then one line
// per skipped figure with its reason, then the warnings.
func (r *report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "name\tvalue\tunit\tbaseline\tratio\tiqr/median\trounds x batch\n")
	for _, f := range r.Measured() {
		ratio, base := "", f.Baseline
		if f.Ratio != 0 {
			ratio = fmt.Sprintf("%.3f", f.Ratio)
		}
		if f.RatioPaired {
			ratio += fmt.Sprintf(" (paired, iqr %.0f%%)", 100*f.RatioSpread)
		}
		spread, rounds := "", ""
		if f.Rounds > 0 {
			spread = fmt.Sprintf("%.0f%%", 100*f.Spread)
			rounds = fmt.Sprintf("%d x %d", f.Rounds, f.Batch)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, formatValue(f), f.Unit, base, ratio, spread, rounds)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range r.Figures {
		if f.Skipped != "" {
			if _, err := fmt.Fprintf(w, "skipped %s: %s\n", f.Name, f.Skipped); err != nil {
				return err
			}
		}
	}
	for _, f := range r.Measured() {
		if f.Note == "" && f.WorkingSet == 0 {
			continue
		}
		note := f.Note
		if f.WorkingSet > 0 {
			note = strings.TrimSuffix(fmt.Sprintf("working set %s; %s", formatBytes(f.WorkingSet), note), "; ")
		}
		if _, err := fmt.Fprintf(w, "note %s: %s\n", f.Name, note); err != nil {
			return err
		}
	}
	for _, s := range r.Warnings {
		if _, err := fmt.Fprintf(w, "warning: %s\n", s); err != nil {
			return err
		}
	}
	return nil
}

func formatValue(f figure) string {
	switch {
	case f.Unit != "ns/op":
		return fmt.Sprintf("%.3f", f.Value)
	case f.Value < 100:
		return fmt.Sprintf("%.2f", f.Value)
	case f.Value < 10000:
		return fmt.Sprintf("%.1f", f.Value)
	}
	return fmt.Sprintf("%.0f", f.Value)
}

// formatBytes prints a byte count in binary units (16 KiB, 1 GiB).
func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.3g GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.3g MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.3g KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
