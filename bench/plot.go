package bench

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// palette has one distinct color per contender; more contenders than colors
// reuse them in order.
var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff},
	color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff},
	color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
	color.RGBA{0xe3, 0x77, 0xc2, 0xff}, color.RGBA{0x7f, 0x7f, 0x7f, 0xff},
	color.RGBA{0xbc, 0xbd, 0x22, 0xff}, color.RGBA{0x17, 0xbe, 0xcf, 0xff},
	color.RGBA{0x39, 0x3b, 0x79, 0xff}, color.RGBA{0xad, 0x49, 0x4a, 0xff},
}

// splitFigure splits "kernels.add.4m.numpy_ns" into the group
// "kernels.add.4m" and the contender "numpy".
func splitFigure(name string) (group, contender string) {
	i := strings.LastIndexByte(name, '.')
	if i < 0 {
		return name, name
	}
	return name[:i], strings.TrimSuffix(name[i+1:], "_ns")
}

// Plot writes a grouped bar chart of the measured ns/op figures to path; the
// format follows the extension (.png, .svg, .pdf, …). Values span seven
// decades (a map lookup to a 64 MiB add), so bars show log10(ns) on a linear
// axis labelled in time units: gonum's log scale cannot draw bars, which
// start at zero.
func (r *report) Plot(path string) error {
	var groups, contenders []string
	val := map[[2]string]float64{}
	for _, f := range r.Measured() {
		if f.Unit != "ns/op" {
			continue
		}
		g, c := splitFigure(f.Name)
		if !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
		if !slices.Contains(contenders, c) {
			contenders = append(contenders, c)
		}
		val[[2]string{g, c}] = f.Value
	}
	p := plot.New()
	p.Title.Text = "shmsteer bench (ns per op, lower is better)"
	p.Y.Label.Text = "time per op (log scale)"
	p.Legend.Top, p.Legend.Left = true, true
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = draw.XRight, draw.YCenter
	type legendEntry struct {
		name string
		bars *plotter.BarChart
	}
	var legend []legendEntry
	legended := map[string]bool{}

	// One single-bar chart per (group, contender), centred on its group
	// among the contenders that group has, so groups with few contenders
	// (keys vs kernels) do not leave gaps for the others' bars.
	width := vg.Points(18)
	top := 1.0
	for gi, g := range groups {
		var present []string
		for _, c := range contenders {
			if _, ok := val[[2]string{g, c}]; ok {
				present = append(present, c)
			}
		}
		for pi, c := range present {
			h := math.Max(math.Log10(val[[2]string{g, c}]), 0) // sub-ns values sit on the floor
			top = math.Max(top, h)
			bars, err := plotter.NewBarChart(plotter.Values{h}, width)
			if err != nil {
				return fmt.Errorf("plot %s.%s: %w", g, c, err)
			}
			ci := slices.Index(contenders, c)
			bars.Color = palette[ci%len(palette)]
			bars.LineStyle.Width = 0
			bars.XMin = float64(gi)
			bars.Offset = width * vg.Length(float64(pi)-float64(len(present)-1)/2)
			p.Add(bars)
			if !legended[c] {
				legended[c] = true
				legend = append(legend, legendEntry{c, bars})
			}
		}
	}
	// Legend in contender order, whatever group first showed each one.
	slices.SortFunc(legend, func(a, b legendEntry) int {
		return slices.Index(contenders, a.name) - slices.Index(contenders, b.name)
	})
	for _, e := range legend {
		p.Legend.Add(e.name, e.bars)
	}
	if len(groups) > 0 {
		p.NominalX(groups...)
		p.X.Min, p.X.Max = -0.6, float64(len(groups))-0.4 // room for the outer bars
	}
	p.Y.Min, p.Y.Max = 0, math.Ceil(top)+1 // headroom for the legend
	p.Y.Tick.Marker = decadeTicks{}
	p.Add(plotter.NewGrid())
	w := vg.Length(max(8, 1.4*float64(len(groups)))) * vg.Inch
	return p.Save(w, 5*vg.Inch, path)
}

// decadeTicks labels log10(ns) as 1 ns, 10 ns, … 1 s.
type decadeTicks struct{}

func (decadeTicks) Ticks(lo, hi float64) []plot.Tick {
	units := []string{"ns", "µs", "ms", "s"}
	var ts []plot.Tick
	for d := math.Ceil(lo); d <= hi; d++ {
		e := int(d)
		label := ""
		if e >= 0 && e/3 < len(units) {
			label = fmt.Sprintf("%d %s", int(math.Pow10(e%3)), units[e/3])
		}
		ts = append(ts, plot.Tick{Value: d, Label: label})
	}
	return ts
}
