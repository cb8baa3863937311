//go:build linux

package capture

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/steer"
)

// BenchmarkFilesystemConsumer: the filesystem consumer's throughput as a fraction of dd's to
// the same directory, in one run. A round captures one request of 32 post_block layers × 64
// rows × 4096 float32 (32 MiB, one record per layer) through a worker's ring into
// RunFilesystem, timed from the first append to the published result (files written, fsynced
// and renamed), against `dd if=/dev/zero of=DIR/dd.bin bs=1M count=32 conv=fsync` (its process
// start included) in the same directory, alternating. fs/dd is the median over rounds of dd's
// time over the consumer's. The directory is $SHMSTEER_BENCH_DIR, else a temporary one.
//
//	go test -run '^$' -bench FilesystemConsumer -benchtime 10x ./capture
func BenchmarkFilesystemConsumer(b *testing.B) {
	dd, err := exec.LookPath("dd")
	if err != nil {
		b.Skip("skipped: no dd on PATH:", err)
	}
	for _, layout := range []Layout{LayoutPerFile, LayoutPacked} {
		b.Run(string(layout), func(b *testing.B) { benchFS(b, dd, layout) })
	}
}

func benchFS(b *testing.B, dd string, layout Layout) {
	const layers, rows, width = 32, 64, 4096
	dir := os.Getenv("SHMSTEER_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	} else {
		var err error
		if dir, err = os.MkdirTemp(dir, "fsbench"); err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	e := newHubEnv(b)
	w := e.worker(b, WorkerOptions{Capacity: 128 << 20, Wait: 10 * time.Second})
	c := e.consumer(b, ConsumerOptions{Name: "fs"})
	cfg := steer.ModelConfig{Hidden: width, Layers: layers}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunFilesystem(ctx, c, FSConsumerOptions{Root: dir, Layout: layout, Config: cfg}, nil) }()
	defer func() { cancel(); <-done }()
	rec := Record{Hook: "post_block", Dtype: Float32, Rows: rows, Width: width, Data: make([]byte, rows*width*4)}
	for i := range rows {
		rec.Positions = append(rec.Positions, i)
	}
	for i := range rec.Data {
		rec.Data[i] = byte(i * 13)
	}
	step := layers * len(rec.Data)
	fsRound := func(n int) time.Duration {
		id := "bench-" + strconv.Itoa(n)
		spec := fmt.Sprintf(`{"request_id": %q, "tag": "bench", "hooks": {"post_block": "all"}, "positions": "all"}`, id)
		e.hub.Begin(id, steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(spec)}, PromptLen: rows})
		t0 := time.Now()
		for l := range layers {
			rec.Layer = l
			if err := w.Writer().Append(id, rec); err != nil {
				b.Fatal(err)
			}
		}
		e.hub.End(id)
		for {
			r, _ := e.hub.Result(id)
			if s := r["fs"].Status; s != StatusPending {
				if s != StatusOK {
					b.Fatalf("%s: %+v", id, r["fs"])
				}
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
		took := time.Since(t0)
		os.RemoveAll(filepath.Join(dir, "bench", id))
		return took
	}
	ddRound := func() time.Duration {
		out := filepath.Join(dir, "dd.bin")
		t0 := time.Now()
		if o, err := exec.Command(dd, "if=/dev/zero", "of="+out, "bs=1M", "count="+strconv.Itoa(step>>20), "conv=fsync", "status=none").CombinedOutput(); err != nil {
			b.Fatalf("dd: %v %s", err, o)
		}
		took := time.Since(t0)
		os.Remove(out)
		return took
	}
	var ratios, fsNs, ddNs []float64
	b.SetBytes(int64(step))
	b.ResetTimer()
	for i := range b.N {
		var tf, td time.Duration
		if i%2 == 0 {
			tf, td = fsRound(i), ddRound()
		} else {
			td, tf = ddRound(), fsRound(i)
		}
		fsNs, ddNs = append(fsNs, float64(tf)), append(ddNs, float64(td))
		ratios = append(ratios, float64(td)/float64(tf))
	}
	b.StopTimer()
	med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	b.ReportMetric(med(ratios), "fs/dd")
	b.ReportMetric(float64(step)/med(fsNs)*1e3, "fs-MB/s")
	b.ReportMetric(float64(step)/med(ddNs)*1e3, "dd-MB/s")
	b.ReportMetric(0, "ns/op")
}
