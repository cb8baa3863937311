//go:build linux

package capture

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/steer"
	"golang.org/x/sys/unix"
)

// BenchmarkConsumerRead: one decode step of the shape (64 requests, all positions, 32
// post_block layers, hidden 4096, float32: 2,048 records of 16 KiB, 32 MiB) appended by a
// worker, then read by a Go consumer attached over ipc (Next, copy each record's rows out,
// Release), against a plain copy of the same 32 MiB out of a shared memfd mapping (the ring's
// kind of memory) into the same destination, alternating in one run. consumer/memcpy is the
// median over rounds of the memcpy time over the consumer's (the consumer's bandwidth as a
// fraction of memcpy's; the goal is ≥ 0.8); batch/memcpy the same for a consumer reading with
// NextBatch (64 records a call); run/memcpy1 is a consumer reading runs (NextRun) and copying
// their rows with non-temporal stores against memcpy1, one copy of the same 32 MiB.
//
// A plain copy out of the ring's own data where the frames lie (either mapping, the ring 40,
// 64 or 128 MiB, the caches evicted before each copy or not) runs at memcpy's speed: the ring's
// memory is not what costs. What did: Next decoding each frame's header between the copies of
// the records' data (0.6-0.7 of memcpy, though Next alone, without the copies, takes only
// about a tenth of its time), where decoding a run of headers and then copying their
// data back to back reads at about 0.9. Next therefore reads up to readAhead records at once.
//
// Every contender is timed by the benchmark thread's CPU time (the goroutine locked to it; the
// reads never block, the records being in the ring before each starts), which leaves out the
// time the thread waits for a core on a loaded machine; the -wall metrics are the same
// ratios by the wall clock.
//
//	go test -run '^$' -bench ConsumerRead -benchtime 30x ./capture
func BenchmarkConsumerRead(b *testing.B) {
	const reqs, layers, width = 64, 32, 4096
	e := newHubEnv(b)
	w := e.worker(b, WorkerOptions{Capacity: 64 << 20, Wait: time.Second})
	c := e.consumer(b, ConsumerOptions{Name: "fs"})
	rec := Record{Hook: "post_block", Dtype: Float32, Rows: 1, Width: width, Positions: []int{100}, Data: make([]byte, width*4)}
	for i := range rec.Data {
		rec.Data[i] = byte(i * 7)
	}
	ids := make([]string, reqs)
	for i := range ids {
		ids[i] = fmt.Sprintf("req-%d", i)
		e.hub.Begin(ids[i], steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
	}
	for range reqs { // the begins
		if ev, ok, err := c.Next(time.Second); err != nil || !ok || ev.Kind != EventBegin {
			b.Fatal(ev, ok, err)
		}
	}
	step := reqs * layers * width * 4
	// The baseline reads the same kind of memory as the ring: a shared memfd mapping.
	m, err := CreateRing(uint64(step), 1)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	src, dst := m.data[:step], make([]byte, step)
	for i := range src {
		src[i] = byte(i)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	type stamp struct{ cpu, wall time.Duration }
	now := func() stamp {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			b.Fatal(err)
		}
		return stamp{time.Duration(ts.Nano()), time.Duration(time.Now().UnixNano())}
	}
	since := func(t0 stamp) stamp { t := now(); return stamp{t.cpu - t0.cpu, t.wall - t0.wall} }
	var ratios, ratios1, ratiosB, ratiosW, ratiosBW, ratiosR1, consNs, batchNs, memNs []float64
	b.SetBytes(int64(step))
	b.ResetTimer()
	appendStep := func() {
		for l := range layers {
			rec.Layer = l
			for _, id := range ids {
				if err := w.Writer().Append(id, rec); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	// The consumer reads what the worker just wrote; the baselines' source is rewritten the
	// same way (untimed) before each copy, so every contender reads freshly written bytes.
	read := func() stamp {
		appendStep()
		t0 := now()
		off := 0
		for n := 0; n < reqs*layers; n++ {
			ev, ok, err := c.Next(time.Second)
			if err != nil || !ok || ev.Kind != EventRecord {
				b.Fatal(ev.Kind, ok, err)
			}
			off += copy(dst[off:], ev.Record.Data)
		}
		c.Release()
		return since(t0)
	}
	// readBatch is read with NextBatch (up to 64 records at a time, released together).
	var evs []Event
	readBatch := func() stamp {
		appendStep()
		t0 := now()
		off := 0
		for n := 0; n < reqs*layers; {
			var err error
			evs, err = c.NextBatch(evs[:0], 64, time.Second)
			if err != nil || len(evs) == 0 {
				b.Fatal(len(evs), err)
			}
			for _, ev := range evs {
				if ev.Kind != EventRecord {
					b.Fatal(ev.Kind)
				}
				off += copy(dst[off:], ev.Record.Data)
			}
			n += len(evs)
		}
		c.Release()
		return since(t0)
	}
	// readRun is read with NextRun (runs of up to 1,024 records), each run's rows copied with
	// non-temporal stores (kernels.StreamCopy), as the C ABI's shmsteer_capture_copy_run does:
	// the consumer's counterpart of memcpy1.
	readRun := func() stamp {
		appendStep()
		t0 := now()
		off := 0
		for n := 0; n < reqs*layers; {
			var err error
			evs, err = c.NextRun(evs[:0], RunOptions{Max: 1024}, time.Second)
			if err != nil || len(evs) == 0 {
				b.Fatal(len(evs), err)
			}
			for i := range evs {
				off += kernels.StreamCopy(dst[off:], evs[i].Record.Data)
			}
			n += len(evs)
		}
		kernels.StoreFence()
		c.Release()
		return since(t0)
	}
	fresh := func() {
		for off := 0; off < step; off += len(rec.Data) {
			copy(src[off:], rec.Data)
		}
	}
	// memcpy copies the same bytes in the records' chunks (16 KiB each); memcpy1 in one 32 MiB
	// copy (which Go does with non-temporal stores, sparing the destination's reads).
	mem := func() stamp {
		fresh()
		t0 := now()
		for off := 0; off < step; off += len(rec.Data) {
			copy(dst[off:off+len(rec.Data)], src[off:])
		}
		return since(t0)
	}
	mem1 := func() stamp {
		fresh()
		t0 := now()
		copy(dst, src)
		return since(t0)
	}
	for i := range b.N {
		var tc, tb, tm, t1, tr stamp
		if i%2 == 0 {
			tc, tm, t1, tb, tr = read(), mem(), mem1(), readBatch(), readRun()
		} else {
			tr, tb, t1, tm, tc = readRun(), readBatch(), mem1(), mem(), read()
		}
		consNs = append(consNs, float64(tc.cpu))
		batchNs = append(batchNs, float64(tb.cpu))
		memNs = append(memNs, float64(tm.cpu))
		ratios = append(ratios, float64(tm.cpu)/float64(tc.cpu))
		ratios1 = append(ratios1, float64(t1.cpu)/float64(tc.cpu))
		ratiosB = append(ratiosB, float64(tm.cpu)/float64(tb.cpu))
		ratiosR1 = append(ratiosR1, float64(t1.cpu)/float64(tr.cpu))
		ratiosW = append(ratiosW, float64(tm.wall)/float64(tc.wall))
		ratiosBW = append(ratiosBW, float64(tm.wall)/float64(tb.wall))
	}
	b.StopTimer()
	med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	b.ReportMetric(med(ratios), "consumer/memcpy")
	b.ReportMetric(med(ratios1), "consumer/memcpy1")
	b.ReportMetric(med(ratiosB), "batch/memcpy")
	b.ReportMetric(med(ratiosR1), "run/memcpy1")
	b.ReportMetric(med(ratiosW), "consumer/memcpy-wall")
	b.ReportMetric(med(ratiosBW), "batch/memcpy-wall")
	b.ReportMetric(float64(step)/med(consNs), "consumer-GB/s")
	b.ReportMetric(float64(step)/med(batchNs), "batch-GB/s")
	b.ReportMetric(float64(step)/med(memNs), "memcpy-GB/s")
	b.ReportMetric(0, "ns/op")
}
