package kernels_test

import (
	"fmt"
	"testing"

	"github.com/shmsteer/shmsteer/kernels"
)

// benchSizes are the AddRows benchmark shapes: D = 4096 and h of 16 KiB,
// 256 KiB, 4 MiB and 64 MiB.
var benchSizes = []struct {
	name string
	t    int
}{{"16k", 1}, {"256k", 16}, {"4m", 256}, {"64m", 4096}}

const benchD = 4096

// goLoopAddRows is the plain Go loop the kernels are compared against.
func goLoopAddRows(h []float32, d int, s float32, v []float32) {
	for t := 0; t+d <= len(h); t += d {
		row := h[t : t+d]
		for i := range row {
			row[i] += s * v[i]
		}
	}
}

func benchData(t int) (h, v []float32) {
	h = make([]float32, t*benchD)
	v = make([]float32, benchD)
	for i := range h {
		h[i] = float32(i%97) * 0.01
	}
	for i := range v {
		v[i] = float32(i%89) * 0.01
	}
	return h, v
}

func BenchmarkAddRows(b *testing.B) {
	orig := kernels.Path()
	defer func() { _ = kernels.SetPath(orig) }()
	for _, sz := range benchSizes {
		h, v := benchData(sz.t)
		// 8 bytes per element: one float32 read and one written.
		bytes := int64(8 * sz.t * benchD)
		for _, p := range kernels.Paths() {
			b.Run(fmt.Sprintf("%s/%s", p, sz.name), func(b *testing.B) {
				if err := kernels.SetPath(p); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(bytes)
				for b.Loop() {
					kernels.AddRows(h, benchD, 1e-3, v)
				}
			})
		}
		b.Run("goloop/"+sz.name, func(b *testing.B) {
			b.SetBytes(bytes)
			for b.Loop() {
				goLoopAddRows(h, benchD, 1e-3, v)
			}
		})
	}
}

func BenchmarkDot(b *testing.B) {
	orig := kernels.Path()
	defer func() { _ = kernels.SetPath(orig) }()
	_, v := benchData(1)
	w := append([]float32(nil), v...)
	for _, p := range kernels.Paths() {
		b.Run(p+"/4096", func(b *testing.B) {
			if err := kernels.SetPath(p); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(8 * benchD)
			for b.Loop() {
				kernels.Dot(v, w)
			}
		})
	}
}

func BenchmarkClamp(b *testing.B) {
	orig := kernels.Path()
	defer func() { _ = kernels.SetPath(orig) }()
	h, v := benchData(16)
	for _, p := range kernels.Paths() {
		b.Run(p+"/16x4096", func(b *testing.B) {
			if err := kernels.SetPath(p); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(12 * len(h))) // read twice, write once
			for b.Loop() {
				kernels.Clamp(h, benchD, v, -1, 1, 1)
			}
		})
	}
}

// BenchmarkAddRows2 compares, on spans of 1–256 rows of 4096, the fused two-source add, Sum2
// into a scratch row then one AddRows with it, and one AddRows pass (the floor).
func BenchmarkAddRows2(b *testing.B) {
	for _, rows := range []int{1, 2, 4, 16, 256} {
		h, x := benchData(rows)
		y := append([]float32(nil), x...)
		tmp := make([]float32, benchD)
		b.Run(fmt.Sprintf("fused/%dx4096", rows), func(b *testing.B) {
			b.SetBytes(int64(8 * len(h)))
			for b.Loop() {
				kernels.AddRows2(h, benchD, 1e-3, x, 1e-3, y)
			}
		})
		b.Run(fmt.Sprintf("sum2/%dx4096", rows), func(b *testing.B) {
			b.SetBytes(int64(8 * len(h)))
			for b.Loop() {
				kernels.Sum2(tmp, 1e-3, x, 1e-3, y)
				kernels.AddRows(h, benchD, 1, tmp)
			}
		})
		b.Run(fmt.Sprintf("one/%dx4096", rows), func(b *testing.B) {
			b.SetBytes(int64(8 * len(h)))
			for b.Loop() {
				kernels.AddRows(h, benchD, 1e-3, x)
			}
		})
	}
}
