package keys

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func benchSetup(b *testing.B) (testOwner, testClient, []string) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.Region.ArenaBytes = 16 << 20
	opts.Region.IndexSlots = 4096
	opts.Grace = time.Hour
	o := newTestOwner(b, opts)
	c := attach(b, env.clientOpts())
	ids := benchKeys(1024)
	key := make([]byte, 32)
	for _, id := range ids {
		require.NoError(b, o.reg.Set(id, key))
	}
	return o, c, ids
}

// BenchmarkClientGet reads keys through a Client attached (Attach, handshake, fds, shm.Open)
// in the owner's own process: the read path is the same plain loads from the mapping as in a
// separate process. TestHelperProcess's "bench-get" role measures it from a child process.
func BenchmarkClientGet(b *testing.B) {
	_, c, ids := benchSetup(b)
	k := c.reg
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		var err error
		if buf, err = k.Get(ids[i&1023], buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClientReaderGet reads keys through a Reader of a Client attached in the
// owner's process.
func BenchmarkClientReaderGet(b *testing.B) {
	_, c, ids := benchSetup(b)
	kr, err := c.reg.NewReader()
	require.NoError(b, err)
	defer kr.Close()
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if buf, err = kr.Get(ids[i&1023], buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOwnerSet writes keys directly in the owner.
func BenchmarkOwnerSet(b *testing.B) {
	o, _, ids := benchSetup(b)
	k := o.reg
	key := make([]byte, 32)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := k.Set(ids[i&1023], key); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClientSetRPC writes keys from a Client over the attach socket (an RPC round trip
// to an owner in the same process; see TestHelperProcess's "bench-set" role for a child).
func BenchmarkClientSetRPC(b *testing.B) {
	_, c, ids := benchSetup(b)
	k := c.reg
	key := make([]byte, 32)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := k.Set(ids[i&1023], key); err != nil {
			b.Fatal(err)
		}
	}
}

// benchChild runs op (a "bench..." command of TestHelperProcess) b.N times in a child process
// attached to an owner in this process, with the given OwnerOptions.SpinWait and
// ClientOptions.SpinWait, and reports the child's own timing as ns/op.
func benchChild(b *testing.B, op string, ownerSpin, clientSpin time.Duration) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.SpinWait = ownerSpin
	opts.Region.ArenaBytes = 16 << 20
	opts.Region.IndexSlots = 4096
	opts.Grace = time.Hour
	o := newTestOwner(b, opts)
	key := make([]byte, 32)
	for _, id := range benchKeys(1024) {
		require.NoError(b, o.reg.Set(id, key))
	}
	p := startClient(b, env, spinEnv+"="+clientSpin.String())
	require.Equal(b, "ok ready", p.Line())
	p.Do(op + " 1000") // warm up
	b.ResetTimer()
	res := p.Do(fmt.Sprintf("%s %d", op, b.N))
	b.StopTimer()
	ns, err := strconv.ParseInt(strings.TrimPrefix(res, "ok "), 10, 64)
	require.NoError(b, err, res)
	b.ReportMetric(float64(ns)/float64(b.N), "ns/op")
	p.Exit()
}

// BenchmarkChildGet: Reader.Get (the worker's fast path) timed inside a separate client
// process.
func BenchmarkChildGet(b *testing.B) { benchChild(b, "benchget", 0, 0) }

// BenchmarkChildRegistryGet: the goroutine-safe Registry.Get timed inside a separate client
// process.
func BenchmarkChildRegistryGet(b *testing.B) { benchChild(b, "benchregget", 0, 0) }

// BenchmarkChildSetRPC: Registry.Set over RPC timed inside a separate client process, with
// the default spin on both sides.
func BenchmarkChildSetRPC(b *testing.B) { benchChild(b, "benchset", 0, 0) }

// BenchmarkChildSetRPCNoSpin: BenchmarkChildSetRPC with spinning off on both sides (both
// parked in the netpoller while they wait).
func BenchmarkChildSetRPCNoSpin(b *testing.B) { benchChild(b, "benchset", -1, -1) }
