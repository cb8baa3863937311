//go:build cgo && linux

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
)

// The keys of the fast-reader tests: fastKeys ids, id i's value at generation g is fastValue(i, g):
// a header naming both and its own length, then bytes derived from them, so a torn or
// misattributed read cannot pass fastCheck. The lengths straddle shm's small-value threshold.
const fastKeys = 256

func fastID(i int) string { return fmt.Sprintf("fast-%04d-0000-4000-8000-000000000000", i) }

func fastValue(i int, g uint64) []byte {
	n := []int{3, 30, 70, 250}[g%4]
	v := fmt.Appendf(nil, "%d:%d:%d|", i, g, n)
	for j := range n {
		v = append(v, byte(uint64(i)*131+g*7+uint64(j)*13))
	}
	return v
}

// fastCheck returns the generation of a value read for id i, or an error if it is not exactly
// fastValue(i, g) for some g.
func fastCheck(i int, v []byte) (uint64, error) {
	head, _, ok := bytes.Cut(v, []byte("|"))
	f := strings.Split(string(head), ":")
	if !ok || len(f) != 3 {
		return 0, fmt.Errorf("id %d: malformed value %q", i, v)
	}
	g, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil || f[0] != strconv.Itoa(i) || !bytes.Equal(v, fastValue(i, g)) {
		return 0, fmt.Errorf("id %d: value %q is not fastValue(%d, %s)", i, v, i, f[1])
	}
	return g, nil
}

// fastGrace is the writer's purge grace: long enough that a revocation is checked before its
// purge, short enough to wait for the purge.
const fastGrace = time.Second

// runKeyWriterRole is the writer of the fast-reader tests: an owner that sets every key, says
// "ready", then rewrites random keys without pause (and now and then revokes one and sets it
// again) until killed; "revoke I" on stdin stops writing id I, revokes it and answers
// "revoked I" once Remove has returned.
func runKeyWriterRole() int {
	s := ipc.NewSecret([]byte(os.Getenv("SHMSTEER_SECRET")))
	o, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &s, Namespace: os.Getenv("SHMSTEER_TEST_NS"),
		Region: shm.Config{IndexSlots: 1 << 12, ArenaBytes: 16 << 20}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		return 1
	}
	reg, err := keys.Open(o, keys.Options{Grace: fastGrace})
	if err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		return 1
	}
	var mu sync.Mutex
	stopped := map[int]bool{}
	gen := uint64(0)
	for i := range fastKeys {
		if err := reg.Set(fastID(i), fastValue(i, gen)); err != nil {
			fmt.Fprintln(os.Stderr, "writer:", err)
			return 1
		}
	}
	fmt.Println("ready")
	go func() {
		for {
			i := rand.IntN(fastKeys)
			mu.Lock()
			if !stopped[i] {
				gen++
				if gen%16 == 0 {
					_ = reg.Remove(fastID(i))
				}
				if err := reg.Set(fastID(i), fastValue(i, gen)); err != nil {
					fmt.Fprintln(os.Stderr, "writer:", err)
					os.Exit(1)
				}
			}
			mu.Unlock()
		}
	}()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var i int
		if _, err := fmt.Sscanf(sc.Text(), "revoke %d", &i); err != nil {
			break
		}
		mu.Lock()
		stopped[i] = true
		err := reg.Remove(fastID(i))
		mu.Unlock()
		if err != nil {
			fmt.Fprintln(os.Stderr, "writer:", err)
			return 1
		}
		fmt.Printf("revoked %d\n", i)
	}
	return 0
}

// fastWriter starts the writer role and a reader registered with the C reader, as
// shmsteer_reader_open makes one.
func fastWriter(t *testing.T) (w *exec.Cmd, in io.Writer, out *bufio.Reader, kr *keys.Reader, h uint64) {
	t.Helper()
	ns := fmt.Sprintf("fast-%d-%d", os.Getpid(), rand.Uint32())
	secret := fmt.Sprintf("fast-secret-%d", rand.Uint64())
	w = exec.Command(os.Args[0], "-test.run=^$")
	w.Env = append(os.Environ(), roleEnv+"=keywriter", "SHMSTEER_SECRET="+secret, "SHMSTEER_TEST_NS="+ns)
	w.Stderr = os.Stderr
	in, err := w.StdinPipe()
	require.NoError(t, err)
	stdout, err := w.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, w.Start())
	t.Cleanup(func() { _ = w.Process.Kill(); _ = w.Wait() })
	out = bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	s := ipc.NewSecret([]byte(secret))
	c, err := ipc.Attach(ipc.ClientOptions{Namespace: ns, Secret: &s, Timeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	reg, err := keys.Attach(c)
	require.NoError(t, err)
	kr, err = reg.NewReader()
	require.NoError(t, err)
	h = handles.put(&reader{kr: kr})
	require.NotZero(t, h)
	fastRegister(h, kr.Descriptor())
	t.Cleanup(func() { fastUnregister(h); handles.remove(h); kr.Close() })
	return w, in, out, kr, h
}

// TestFastReaderAgrees: the C reader and the Go reader, generated from one source, in one
// reader process, against an owner process that rewrites keys without pause. Every value
// either returns is exactly one the writer wrote for that id, and neither ever goes back to an
// older one than the other has returned; the C reader answers most gets (it is in use). A
// revocation is seen by the very next get, in C and in Go, and so is its purge. Then the writer is SIGKILLed at a
// random point: every entry still reads whole, and both readers give the same answer.
func TestFastReaderAgrees(t *testing.T) {
	w, in, out, kr, h := fastWriter(t)
	buf := make([]byte, 512)
	last := make([]uint64, fastKeys)
	seen := func(i int, v []byte, from string) {
		t.Helper()
		g, err := fastCheck(i, v)
		require.NoError(t, err, from)
		require.GreaterOrEqual(t, g, last[i], "%s reader went back from generation %d to %d for id %d", from, last[i], g, i)
		last[i] = g
	}
	goGet := func(i int) error {
		v, err := kr.Get(fastID(i), buf[:0])
		if err == nil {
			seen(i, v, "Go")
		}
		return err
	}
	served, gets := 0, 0
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		for i := range fastKeys {
			gets++
			if n, ok := fastGet(h, fastID(i), buf); ok {
				served++
				seen(i, buf[:n], "C")
			}
			if err := goGet(i); err != nil && !errors.Is(err, keys.ErrRevoked) {
				t.Fatalf("Go get of id %d: %v", i, err)
			}
		}
	}
	t.Logf("C reader answered %d of %d gets under concurrent writes", served, gets)
	require.Greater(t, served, gets/2, "the C reader answers the common case")

	revoked := rand.Perm(fastKeys)[:32]
	for _, i := range revoked {
		_, err := fmt.Fprintf(in, "revoke %d\n", i)
		require.NoError(t, err)
		line, err := out.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("revoked %d\n", i), line)
		_, ok := fastGet(h, fastID(i), buf)
		require.False(t, ok, "C reader returned id %d's key after its revocation", i)
		_, err = kr.Get(fastID(i), buf[:0])
		require.ErrorIs(t, err, keys.ErrRevoked)
	}

	// The purge after the grace: Go sees the id gone (ErrNotFound), and C never answers it.
	for _, i := range revoked {
		for deadline := time.Now().Add(fastGrace + 10*time.Second); ; time.Sleep(10 * time.Millisecond) {
			_, ok := fastGet(h, fastID(i), buf)
			require.False(t, ok, "C reader returned id %d's key after its revocation", i)
			_, err := kr.Get(fastID(i), buf[:0])
			if errors.Is(err, keys.ErrNotFound) {
				break
			}
			require.ErrorIs(t, err, keys.ErrRevoked)
			require.True(t, time.Now().Before(deadline), "id %d not purged", i)
		}
	}

	time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond)
	require.NoError(t, w.Process.Signal(syscall.SIGKILL))
	_ = w.Wait()
	disagree := 0
	for i := range fastKeys {
		n, ok := fastGet(h, fastID(i), buf)
		var cv []byte
		if ok {
			cv = append(cv, buf[:n]...)
			seen(i, cv, "C")
		}
		gv, err := kr.Get(fastID(i), nil)
		switch {
		case ok:
			require.NoError(t, err, "id %d: C read a key, Go %v", i, err)
			require.Equal(t, cv, gv, "id %d", i)
		case err == nil:
			// The C reader leaves a newest blob above the pinned version to Go: the writer
			// was killed between linking a blob and publishing its version.
			seen(i, gv, "Go")
			disagree++
		default:
			if !errors.Is(err, keys.ErrNotFound) {
				require.ErrorIs(t, err, keys.ErrRevoked, "id %d", i)
			}
		}
	}
	require.LessOrEqual(t, disagree, 2, "the C reader declined live keys it should answer")
}
