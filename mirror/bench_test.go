package mirror

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkPropagate times a named-vector update (one 16 KiB entry) from the moment host a's
// owner starts the write until host b's worker reads the new value (wall clock, one machine,
// loopback NATS). Each iteration is one update; run with -benchtime 300x.
func BenchmarkPropagate(b *testing.B) {
	n := startNATS(b)
	hs := startHosts(b, n, newSecret(), []string{"a", "b"}, hostOpts{})
	a, w := hs[0].owner, hs[1].worker
	a.OK("reg lat 1 1")
	eventually(b, w, "vec lat", "1/1", 20*time.Second, "warm-up")
	lat := make([]int64, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		seed := i + 2
		w.Send(fmt.Sprintf("wait lat %d/1", seed)) // b's worker polls from now on
		t0, err := strconv.ParseInt(a.OK(fmt.Sprintf("reg lat %d 1", seed)), 10, 64)
		require.NoError(b, err)
		l := w.Line()
		require.True(b, strings.HasPrefix(l, "ok "), l)
		t1, err := strconv.ParseInt(l[3:], 10, 64)
		require.NoError(b, err)
		lat = append(lat, t1-t0)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "propagate_p50_ns")
	b.ReportMetric(float64(lat[len(lat)*99/100]), "propagate_p99_ns")
	b.ReportMetric(float64(lat[len(lat)*9/10]), "propagate_p90_ns")
	b.ReportMetric(float64(lat[len(lat)-1]), "propagate_max_ns")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkKeyGetMirrored measures a worker's local key Get latency (each Get timed alone,
// over 1,024 keys) on host a while nothing is mirrored and while host b sets 1,000 keys a
// second that the mirror applies to a's region, alternating, 5 rounds each of 2 M Gets. It
// reports the median over rounds of each condition's p50 and p99 and the p99 ratio.
func BenchmarkKeyGetMirrored(b *testing.B) {
	n := startNATS(b)
	hs := startHosts(b, n, newSecret(), []string{"a", "b"}, hostOpts{keys: true})
	wa, ob := hs[0].worker, hs[1].owner
	ob.OK("fill 1024") // 1,024 keys ld-* through the mirror
	require.Equal(b, "ok true", ob.Do("drain"))
	eventually(b, wa, "key ld-1023", fmt.Sprintf("ok %064x", 0), 20*time.Second, "keys mirrored")
	get := func() (p50, p99 float64) {
		f := strings.Fields(wa.OK("getlat 2000000"))
		x, _ := strconv.ParseFloat(f[0], 64)
		y, _ := strconv.ParseFloat(f[1], 64)
		return x, y
	}
	var q50, q99, l50, l99 []float64
	b.ResetTimer()
	for range b.N {
		for range 5 {
			x, y := get()
			q50, q99 = append(q50, x), append(q99, y)
			before := hs[0].owner.status().Applied
			ob.OK("load 1000 400")
			time.Sleep(50 * time.Millisecond)
			x, y = get()
			ob.OK("loadwait")
			l50, l99 = append(l50, x), append(l99, y)
			applied := hs[0].owner.status().Applied - before
			require.Greater(b, applied, uint64(200), "the load was mirrored to a")
		}
	}
	b.StopTimer()
	med := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(q50), "get_p50_quiet_ns")
	b.ReportMetric(med(q99), "get_p99_quiet_ns")
	b.ReportMetric(med(l50), "get_p50_mirrored_ns")
	b.ReportMetric(med(l99), "get_p99_mirrored_ns")
	b.ReportMetric(med(l99)/med(q99), "p99_ratio")
	b.ReportMetric(0, "ns/op")
}
