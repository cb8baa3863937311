package ipc

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const echoLenOp = 300 // test handler: replies with the request's length, in decimal

// partialFrame writes the header of a total-byte frame (op echoLenOp, id) and then n bytes of
// its payload, on an attached client's connection, bypassing the client's own framing.
func partialFrame(t *testing.T, c *net.UnixConn, total, n int, id uint32) error {
	t.Helper()
	hdr := beginFrame(nil, echoLenOp, id)
	binary.LittleEndian.PutUint32(hdr, uint32(total-4))
	if _, err := c.Write(hdr); err != nil {
		return err
	}
	chunk := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, len(chunk))
		if _, err := c.Write(chunk[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// TestWriteTimeout: a client that pipelines requests and never reads the replies is dropped
// once a reply write stalls for WriteTimeout, instead of holding an owner goroutine forever.
func TestWriteTimeout(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.WriteTimeout = 200 * time.Millisecond
	o := newTestOwner(t, opts)
	big := make([]byte, 256<<10)
	o.Handle(echoLenOp+1, func([]byte) ([]byte, error) { return big, nil })
	c := attach(t, env.clientOpts())
	require.Equal(t, 1, o.Clients())
	var reqs []byte
	for i := range 200 { // 200 requests of 10 bytes; 50 MiB of replies nobody reads
		reqs = appendFrame(reqs, echoLenOp+1, uint32(i+1), nil)
	}
	c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := c.conn.Write(reqs)
	require.NoError(t, err)
	start := time.Now()
	require.Eventually(t, func() bool { return o.Clients() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the owner drops a client that does not read its replies")
	t.Logf("non-reading client dropped %v after its requests (WriteTimeout 200ms)", time.Since(start).Round(time.Millisecond))
}

// TestStalledFrame: a client that starts a large frame and stalls is dropped after
// FrameTimeout, and its buffer goes back to the budget.
func TestStalledFrame(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.MaxFrameBytes = 4 << 20
	opts.FrameTimeout = 300 * time.Millisecond
	o := newTestOwner(t, opts)
	c := attach(t, env.clientOpts())
	require.NoError(t, partialFrame(t, c.conn, 4<<20, 3<<20, 7))
	require.Eventually(t, func() bool { return o.budget.inUse() > 0 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return o.Clients() == 0 && o.budget.inUse() == 0 }, 10*time.Second, 5*time.Millisecond)
	// It was told why.
	var fr frameReader
	defer fr.wipe()
	c.conn.SetReadDeadline(time.Now().Add(time.Second))
	f, err := fr.next(c.conn.Read, 1<<20)
	require.NoError(t, err)
	require.Equal(t, opReplyErr, f.op)
	require.Equal(t, uint32(7), f.id)
	code, _, err := decodeError(f.payload)
	require.NoError(t, err)
	require.ErrorIs(t, sentinelOf(code), ErrBusy)
}

// TestBufferBudget: MaxBufferedBytes bounds what all connections buffer together; a frame
// that finds no room waits (its sender blocks) until another frame is done.
func TestBufferBudget(t *testing.T) {
	env := newTestEnv()
	opts := env.ownerOpts()
	opts.MaxFrameBytes = 4 << 20
	opts.MaxBufferedBytes = 4 << 20
	o := newTestOwner(t, opts)
	o.Handle(echoLenOp, func(req []byte) ([]byte, error) { return []byte(strconv.Itoa(len(req))), nil })
	a := attach(t, env.clientOpts())
	b := attach(t, env.clientOpts())

	// a: 3 MiB of a 4 MiB frame, then a pause.
	require.NoError(t, partialFrame(t, a.conn, 4<<20, 3<<20, 1))
	require.Eventually(t, func() bool { return o.budget.inUse() > 3<<20 }, 5*time.Second, time.Millisecond)
	// b: a 2 MiB frame has no room: it waits.
	done := make(chan error, 1)
	var got []byte
	go func() {
		var err error
		got, err = b.Call(echoLenOp, make([]byte, 2<<20))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("b's frame was served while a's filled the budget: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.LessOrEqual(t, o.budget.inUse(), 4<<20)
	// a finishes its frame: both are served.
	_, err := a.conn.Write(make([]byte, 1<<20-frameHeader))
	require.NoError(t, err)
	var fr frameReader
	defer fr.wipe()
	a.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := fr.next(a.conn.Read, 1<<20)
	require.NoError(t, err)
	require.Equal(t, opReplyOK, f.op)
	require.Equal(t, strconv.Itoa(4<<20-frameHeader), string(f.payload))
	require.NoError(t, <-done)
	require.Equal(t, strconv.Itoa(2<<20), string(got))
	require.Eventually(t, func() bool { return o.budget.inUse() == 0 }, 5*time.Second, time.Millisecond)
}

// vmRSS is a process's resident set in bytes.
func vmRSS(t *testing.T, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.Atoi(f[1])
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// settle polls the owner's RSS until it holds still (three equal readings in a row, ±1 MiB).
func settle(t *testing.T, pid int) int {
	prev, still := vmRSS(t, pid), 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && still < 3; {
		time.Sleep(100 * time.Millisecond)
		cur := vmRSS(t, pid)
		if d := cur - prev; d < 1<<20 && d > -(1<<20) {
			still++
		} else {
			still = 0
		}
		prev = cur
	}
	return prev
}

// TestProcOwnerMemoryBound: three attached clients each send 48 MiB of a 64 MiB frame and
// stall. The owner (defaults: 64 MiB frames, 128 MiB MaxBufferedBytes) buffers at most
// MaxBufferedBytes, and gives the memory back once they are gone.
func TestProcOwnerMemoryBound(t *testing.T) {
	env := newTestEnv()
	owner := startProc(t, "owner", append(env.childEnv(), frameTimeoutEnv+"=60s")...)
	require.Equal(t, "ok ready", owner.Line())
	pid := owner.Cmd.Process.Pid
	base := settle(t, pid)

	var wg sync.WaitGroup
	var clients []*Client
	for i := range 3 {
		c := attach(t, env.clientOpts())
		clients = append(clients, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.conn.SetWriteDeadline(time.Now().Add(60 * time.Second))
			partialFrame(t, c.conn, DefaultMaxFrameBytes, 48<<20, uint32(i+1)) // the third blocks: no room
		}()
	}
	under := settle(t, pid)
	for _, c := range clients {
		c.conn.Close()
	}
	wg.Wait()
	after := settle(t, pid)
	t.Logf("owner VmRSS: %d MiB before, %d MiB under 3 × 48 MiB of 64 MiB frames, %d MiB after the clients closed",
		base>>20, under>>20, after>>20)
	require.Less(t, under-base, 2*DefaultMaxFrameBytes+16<<20, "bounded by MaxBufferedBytes")
	require.Less(t, after-base, 16<<20, "given back")
}

// TestProcPendingFlood: with the owner's open-file limit at 1,024, 1,100 idle connections of
// the owner's uid are held open; a legitimate attach still succeeds, because the owner closes
// the oldest pending handshake when MaxPendingHandshakes (64) is reached. With the limit at
// 40, below the bound, accept runs out of descriptors (EMFILE) first: the same.
func TestProcPendingFlood(t *testing.T) {
	for _, nofile := range []int{1024, 40} {
		t.Run(fmt.Sprint("RLIMIT_NOFILE ", nofile), func(t *testing.T) { pendingFlood(t, nofile) })
	}
}

func pendingFlood(t *testing.T, nofile int) {
	env := newTestEnv()
	owner := startProc(t, "owner", append(env.childEnv(), fmt.Sprint(nofileEnv, "=", nofile))...)
	require.Equal(t, "ok ready", owner.Line())
	handle := handleNames(env.secret, env.ns)[0]
	var idle []*net.UnixConn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 1100 {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: "@" + handle, Net: "unix"})
		require.NoError(t, err)
		idle = append(idle, c)
	}
	co := env.clientOpts()
	co.Timeout = 3 * time.Second
	start := time.Now()
	c, err := Attach(co)
	took := time.Since(start)
	require.NoError(t, err, "a legitimate attach gets through 1,100 idle connections")
	defer c.Close()
	require.NoError(t, c.Ping())
	require.Equal(t, "ok 1", owner.Do("clients"))
	t.Logf("attach with 1,100 idle connections held open (owner RLIMIT_NOFILE %d): %v", nofile, took.Round(time.Microsecond))
	require.Less(t, took, co.Timeout)
}
