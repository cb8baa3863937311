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
	cb := &consumerReadBench{
		b:      b,
		w:      e.worker(b, WorkerOptions{Capacity: 64 << 20, Wait: time.Second}),
		c:      e.consumer(b, ConsumerOptions{Name: "fs"}),
		layers: layers,
		rec:    Record{Hook: "post_block", Dtype: Float32, Rows: 1, Width: width, Positions: []int{100}, Data: make([]byte, width*4)},
		ids:    make([]string, reqs),
		step:   reqs * layers * width * 4,
	}
	for i := range cb.rec.Data {
		cb.rec.Data[i] = byte(i * 7)
	}
	for i := range cb.ids {
		cb.ids[i] = fmt.Sprintf("req-%d", i)
		e.hub.Begin(cb.ids[i], steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
	}
	for range reqs { // the begins
		if ev, ok, err := cb.c.Next(time.Second); err != nil || !ok || ev.Kind != EventBegin {
			b.Fatal(ev, ok, err)
		}
	}
	// The baseline reads the same kind of memory as the ring: a shared memfd mapping.
	m, err := CreateRing(uint64(cb.step), 1)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	cb.src, cb.dst = m.data[:cb.step], make([]byte, cb.step)
	for i := range cb.src {
		cb.src[i] = byte(i)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ratios, ratios1, ratiosB, ratiosW, ratiosBW, ratiosR1, consNs, batchNs, memNs []float64
	b.SetBytes(int64(cb.step))
	b.ResetTimer()
	for i := range b.N {
		var tc, tb, tm, t1, tr stamp
		if i%2 == 0 {
			tc, tm, t1, tb, tr = cb.read(), cb.mem(), cb.mem1(), cb.readBatch(), cb.readRun()
		} else {
			tr, tb, t1, tm, tc = cb.readRun(), cb.readBatch(), cb.mem1(), cb.mem(), cb.read()
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
	step := float64(cb.step)
	b.ReportMetric(step/med(consNs), "consumer-GB/s")
	b.ReportMetric(step/med(batchNs), "batch-GB/s")
	b.ReportMetric(step/med(memNs), "memcpy-GB/s")
	b.ReportMetric(0, "ns/op")
}

// stamp is a reading of the thread's CPU clock and of the wall clock.
type stamp struct{ cpu, wall time.Duration }

// consumerReadBench is BenchmarkConsumerRead's state: the worker w appends a step of records
// (the layers of rec for each of ids, step bytes in all), the contenders copy them into dst;
// src is the baselines' source, a shared memfd mapping.
type consumerReadBench struct {
	b        *testing.B
	w        *Worker
	c        *Consumer
	layers   int
	rec      Record
	ids      []string
	step     int
	src, dst []byte
	evs      []Event
}

func (cb *consumerReadBench) now() stamp {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		cb.b.Fatal(err)
	}
	return stamp{time.Duration(ts.Nano()), time.Duration(time.Now().UnixNano())}
}

func (cb *consumerReadBench) since(t0 stamp) stamp {
	t := cb.now()
	return stamp{t.cpu - t0.cpu, t.wall - t0.wall}
}

func (cb *consumerReadBench) records() int { return len(cb.ids) * cb.layers }

func (cb *consumerReadBench) appendStep() {
	for l := range cb.layers {
		cb.rec.Layer = l
		for _, id := range cb.ids {
			if err := cb.w.Writer().Append(id, cb.rec); err != nil {
				cb.b.Fatal(err)
			}
		}
	}
}

// read: the consumer reads what the worker just wrote with Next; the baselines' source is
// rewritten the same way (untimed) before each copy, so every contender reads freshly written
// bytes.
func (cb *consumerReadBench) read() stamp {
	cb.appendStep()
	t0 := cb.now()
	off := 0
	for n := 0; n < cb.records(); n++ {
		ev, ok, err := cb.c.Next(time.Second)
		if err != nil || !ok || ev.Kind != EventRecord {
			cb.b.Fatal(ev.Kind, ok, err)
		}
		off += copy(cb.dst[off:], ev.Record.Data)
	}
	cb.c.Release()
	return cb.since(t0)
}

// readBatch is read with NextBatch (up to 64 records at a time, released together).
func (cb *consumerReadBench) readBatch() stamp {
	cb.appendStep()
	t0 := cb.now()
	off := 0
	for n := 0; n < cb.records(); {
		var err error
		cb.evs, err = cb.c.NextBatch(cb.evs[:0], 64, time.Second)
		if err != nil || len(cb.evs) == 0 {
			cb.b.Fatal(len(cb.evs), err)
		}
		for _, ev := range cb.evs {
			if ev.Kind != EventRecord {
				cb.b.Fatal(ev.Kind)
			}
			off += copy(cb.dst[off:], ev.Record.Data)
		}
		n += len(cb.evs)
	}
	cb.c.Release()
	return cb.since(t0)
}

// readRun is read with NextRun (runs of up to 1,024 records), each run's rows copied with
// non-temporal stores (kernels.StreamCopy), as the C ABI's shmsteer_capture_copy_run does:
// the consumer's counterpart of memcpy1.
func (cb *consumerReadBench) readRun() stamp {
	cb.appendStep()
	t0 := cb.now()
	off := 0
	for n := 0; n < cb.records(); {
		var err error
		cb.evs, err = cb.c.NextRun(cb.evs[:0], RunOptions{Max: 1024}, time.Second)
		if err != nil || len(cb.evs) == 0 {
			cb.b.Fatal(len(cb.evs), err)
		}
		for i := range cb.evs {
			off += kernels.StreamCopy(cb.dst[off:], cb.evs[i].Record.Data)
		}
		n += len(cb.evs)
	}
	kernels.StoreFence()
	cb.c.Release()
	return cb.since(t0)
}

func (cb *consumerReadBench) fresh() {
	for off := 0; off < cb.step; off += len(cb.rec.Data) {
		copy(cb.src[off:], cb.rec.Data)
	}
}

// mem copies the same bytes in the records' chunks (16 KiB each).
func (cb *consumerReadBench) mem() stamp {
	cb.fresh()
	t0 := cb.now()
	for off := 0; off < cb.step; off += len(cb.rec.Data) {
		copy(cb.dst[off:off+len(cb.rec.Data)], cb.src[off:])
	}
	return cb.since(t0)
}

// mem1 copies them in one 32 MiB copy (which Go does with non-temporal stores, sparing the
// destination's reads).
func (cb *consumerReadBench) mem1() stamp {
	cb.fresh()
	t0 := cb.now()
	copy(cb.dst, cb.src)
	return cb.since(t0)
}
