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

// benchChild runs op (a "bench..." command of TestHelperProcess) b.N times in a child process
// attached to an owner in this process, with the given OwnerOptions.SpinWait and
// ClientOptions.SpinWait, and reports the child's own timing as ns/op.
func benchChild(b *testing.B, op string, ownerSpin, clientSpin time.Duration) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.SpinWait = ownerSpin
	opts.Region.ArenaBytes = 16 << 20
	opts.Region.IndexSlots = 4096
	newTestOwner(b, opts)
	p := startProc(b, "client", append(env.childEnv(), spinEnv+"="+clientSpin.String())...)
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

// BenchmarkChildPing: an empty RPC round trip timed inside a separate client process, with
// the default spin on both sides.
func BenchmarkChildPing(b *testing.B) { benchChild(b, "benchping", 0, 0) }

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
