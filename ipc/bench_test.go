package ipc

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// benchKeys are UUID-shaped request ids with 32-byte keys, as in bench/keys.go.
func benchKeys(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%08x-1234-5678-9abc-%012x", i, i*7919)
	}
	return ids
}

func benchSetup(b *testing.B) (*Owner, *Client, []string) {
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
		require.NoError(b, o.Keys().Set(id, key))
	}
	return o, c, ids
}

// BenchmarkClientGet reads keys through a Client attached (Attach, handshake, fds, shm.Open)
// in the owner's own process: the read path is the same plain loads from the mapping as in a
// separate process. TestHelperProcess's "bench-get" role measures it from a child process.
func BenchmarkClientGet(b *testing.B) {
	_, c, ids := benchSetup(b)
	k := c.Keys()
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		var err error
		if buf, err = k.Get(ids[i&1023], buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClientKeyReaderGet reads keys through a KeyReader of a Client attached in the
// owner's process.
func BenchmarkClientKeyReaderGet(b *testing.B) {
	_, c, ids := benchSetup(b)
	kr, err := c.Keys().NewReader()
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
	k := o.Keys()
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
	k := c.Keys()
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
		require.NoError(b, o.Keys().Set(id, key))
	}
	p := startProc(b, "client", append(env.childEnv(), spinEnv+"="+clientSpin.String())...)
	require.Equal(b, "ok ready", p.line())
	p.do(op + " 1000") // warm up
	b.ResetTimer()
	res := p.do(fmt.Sprintf("%s %d", op, b.N))
	b.StopTimer()
	ns, err := strconv.ParseInt(strings.TrimPrefix(res, "ok "), 10, 64)
	require.NoError(b, err, res)
	b.ReportMetric(float64(ns)/float64(b.N), "ns/op")
	p.exit()
}

// BenchmarkChildGet: KeyReader.Get (the worker's fast path) timed inside a separate client
// process.
func BenchmarkChildGet(b *testing.B) { benchChild(b, "benchget", 0, 0) }

// BenchmarkChildRegistryGet: the goroutine-safe Registry.Get timed inside a separate client
// process.
func BenchmarkChildRegistryGet(b *testing.B) { benchChild(b, "benchregget", 0, 0) }

// BenchmarkChildSetRPC: Registry.Set over RPC timed inside a separate client process, with
// the default spin on both sides.
func BenchmarkChildSetRPC(b *testing.B) { benchChild(b, "benchset", 0, 0) }

// BenchmarkChildPing: an empty RPC round trip timed inside a separate client process, with
// the default spin on both sides.
func BenchmarkChildPing(b *testing.B) { benchChild(b, "benchping", 0, 0) }

// BenchmarkChildSetRPCNoSpin: BenchmarkChildSetRPC with spinning off on both sides (both
// parked in the netpoller while they wait).
func BenchmarkChildSetRPCNoSpin(b *testing.B) { benchChild(b, "benchset", -1, -1) }

// BenchmarkChildPingNoSpin: BenchmarkChildPing with spinning off on both sides.
func BenchmarkChildPingNoSpin(b *testing.B) { benchChild(b, "benchping", -1, -1) }

// BenchmarkSquatterSkip is what a squatter costs a client: connect to a listener, read its
// credentials (SO_PEERCRED), find its uid not allowed, close, before a byte is sent. The
// listener is this process's; refusing every uid makes it a squatter to the client.
func BenchmarkSquatterSkip(b *testing.B) {
	name := "shmsteer-bench-squat-" + randHex(8)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
	require.NoError(b, err)
	defer ln.Close()
	go func() { // accept and close, as a squatter might (or not: the client never waits)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	names := []string{name}
	refuse := func(int) bool { return false }
	for b.Loop() {
		c, skipped, err := dialFirstAllowed(names, refuse, time.Now().Add(time.Second))
		if err != nil || c != nil || len(skipped) != 1 {
			b.Fatalf("not skipped: %v %v %v", c, skipped, err)
		}
	}
}
