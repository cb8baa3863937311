package ipc

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	followRoleEnv = "SHMSTEER_FOLLOW_ROLE"
	followNSEnv   = "SHMSTEER_FOLLOW_NS"
	followGenEnv  = "SHMSTEER_FOLLOW_GEN"
	followKeys    = 16
)

// followValue is a self-checking key: owner generation, counter, and a sha256 of both, so a
// torn read (bytes of two writes) fails verify.
func followValue(gen, n uint64) []byte {
	b := binary.LittleEndian.AppendUint64(nil, gen)
	b = binary.LittleEndian.AppendUint64(b, n)
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

func verifyFollowValue(b []byte) (gen uint64, err error) {
	if len(b) != 48 {
		return 0, fmt.Errorf("value of %d bytes", len(b))
	}
	if sum := sha256.Sum256(b[:16]); string(sum[:]) != string(b[16:]) {
		return 0, errors.New("torn value: checksum mismatch")
	}
	return binary.LittleEndian.Uint64(b), nil
}

// TestFollowHelperProcess is the owner child of TestFollowerAcrossOwnerRestart: it serves the
// namespace and rewrites every key in a loop until it is killed.
func TestFollowHelperProcess(t *testing.T) {
	if os.Getenv(followRoleEnv) != "owner" {
		t.Skip("helper process")
	}
	gen, _ := strconv.ParseUint(os.Getenv(followGenEnv), 10, 64)
	o, err := NewOwner(OwnerOptions{Namespace: os.Getenv(followNSEnv), Region: testRegion, Logger: quietLogger()})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	for i := range followKeys {
		ownerStore(o).Set(fmt.Sprintf("k%d", i), followValue(gen, 0))
	}
	fmt.Println("ready")
	for n := uint64(1); ; n++ {
		if err := ownerStore(o).Set(fmt.Sprintf("k%d", n%followKeys), followValue(gen, n)); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		if n%64 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

type followOwner struct {
	cmd   *exec.Cmd
	ready time.Time
}

func startFollowOwner(t *testing.T, env testEnv, gen int) *followOwner {
	cmd := exec.Command(os.Args[0], "-test.run=^TestFollowHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), followRoleEnv+"=owner", followNSEnv+"="+env.ns, followGenEnv+"="+strconv.Itoa(gen), SecretEnv+"="+env.secretStr)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	require.True(t, sc.Scan(), "owner child exited")
	require.Equal(t, "ready", sc.Text())
	return &followOwner{cmd: cmd, ready: time.Now()}
}

// TestFollowerAcrossOwnerRestart runs owners as child processes: the first is SIGKILLed while
// this process reads keys through a Follower from several goroutines; reads keep coming from
// the dead region (flagged by Dead and Err), never torn; a second owner of the namespace
// starts, the Follower re-attaches by itself, and reads then see the new owner's values.
func TestFollowerAcrossOwnerRestart(t *testing.T) {
	env := newTestEnv()
	o1 := startFollowOwner(t, env, 1)
	var changes atomic.Uint64
	f, err := Follow(FollowOptions{Client: ClientOptions{Secret: &env.secret, Namespace: env.ns},
		Poll: 5 * time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, Retire: 200 * time.Millisecond,
		OnChange: func(*Client, uint64) { changes.Add(1) }})
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Err())

	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		readErr  error
		seenGen  [3]atomic.Uint64 // reads per generation
		deadRead atomic.Uint64    // reads made while flagged dead
	)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, 64)
			for i := 0; !stop.Load(); i++ {
				c := f.Client() // one client per unit of work
				dead := f.Dead()
				for k := range followKeys {
					v, err := clientStore(c).Get(fmt.Sprintf("k%d", (k+w)%followKeys), buf[:0])
					if err == nil {
						var g uint64
						g, err = verifyFollowValue(v)
						if err == nil && g < uint64(len(seenGen)) {
							seenGen[g].Add(1)
						}
					}
					if err != nil {
						mu.Lock()
						readErr = errors.Join(readErr, err)
						mu.Unlock()
						return
					}
				}
				if dead {
					deadRead.Add(1)
				}
			}
		}()
	}
	require.Eventually(t, func() bool { return seenGen[1].Load() > 100 }, 10*time.Second, time.Millisecond)

	require.NoError(t, o1.cmd.Process.Signal(syscall.SIGKILL))
	o1.cmd.Wait()
	require.Eventually(t, f.Dead, 10*time.Second, time.Millisecond, "the follower did not notice the owner's death")
	require.ErrorIs(t, f.Err(), ErrDeadRegion)
	require.Eventually(t, func() bool { return deadRead.Load() > 10 }, 10*time.Second, time.Millisecond, "reads stopped while the owner was dead")
	require.Equal(t, uint64(1), f.Generation())

	o2 := startFollowOwner(t, env, 2)
	require.Eventually(t, func() bool { return f.Generation() == 2 && !f.Dead() }, 10*time.Second, 100*time.Microsecond)
	reattach := time.Since(o2.ready)
	require.NoError(t, f.Err())
	require.Equal(t, uint64(1), changes.Load())
	readFailed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return readErr
	}
	require.Eventually(t, func() bool { return seenGen[2].Load() > 100 || readFailed() != nil }, 10*time.Second, time.Millisecond)
	require.NoError(t, readFailed(), "a reader stopped on an error")
	stop.Store(true)
	wg.Wait()
	require.NoError(t, readErr)
	t.Logf("re-attached %v after the new owner was ready (poll 5 ms); reads gen1 %d, gen2 %d, while dead %d steps",
		reattach, seenGen[1].Load(), seenGen[2].Load(), deadRead.Load())
	require.NoError(t, f.Client().Ping())
	require.NoError(t, f.Close())
	require.ErrorIs(t, f.Close(), ErrClosed)
}

func TestFollowNeedsAnOwner(t *testing.T) {
	env := newTestEnv()
	_, err := Follow(FollowOptions{Client: ClientOptions{Secret: &env.secret, Namespace: env.ns}})
	require.ErrorIs(t, err, ErrNotYetInitialized)
	_, err = Follow(FollowOptions{Client: ClientOptions{Secret: &Secret{}, Namespace: env.ns}})
	require.ErrorIs(t, err, ErrAuthSecretNotDefined)
	require.False(t, strings.Contains(fmt.Sprint(env.secret), env.secretStr))
}

// BenchmarkFollowReattach measures how long a Follower takes to serve from a new owner once
// it is ready (reattach-ns: from the new owner's "ready" line to the generation change), with
// the default 100 ms poll and 10 ms..1 s backoff; each iteration SIGKILLs the owner child and
// starts another. The detection delay (up to one poll) is reported apart as detect-ns.
func BenchmarkFollowReattach(b *testing.B) {
	env := newTestEnv()
	start := func(gen int) *followOwner {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFollowHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), followRoleEnv+"=owner", followNSEnv+"="+env.ns, followGenEnv+"="+strconv.Itoa(gen), SecretEnv+"="+env.secretStr)
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		if !sc.Scan() || sc.Text() != "ready" {
			b.Fatal("owner child did not start")
		}
		return &followOwner{cmd: cmd, ready: time.Now()}
	}
	o := start(1)
	f, err := Follow(FollowOptions{Client: ClientOptions{Secret: &env.secret, Namespace: env.ns}})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var reattach, detect time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		killed := time.Now()
		o.cmd.Process.Kill()
		o.cmd.Wait()
		for !f.Dead() {
			time.Sleep(100 * time.Microsecond)
		}
		detect += time.Since(killed)
		o = start(i + 2)
		b.StartTimer()
		for f.Generation() != uint64(i+2) {
			time.Sleep(50 * time.Microsecond)
		}
		reattach += time.Since(o.ready)
	}
	b.StopTimer()
	o.cmd.Process.Kill()
	o.cmd.Wait()
	b.ReportMetric(float64(reattach.Nanoseconds())/float64(b.N), "reattach-ns")
	b.ReportMetric(float64(detect.Nanoseconds())/float64(b.N), "detect-ns")
}

// TestFollowerWaitsForReady: with Ready set, the Follower keeps reading the dead region until
// the new owner says its region is ready, then switches.
func TestFollowerWaitsForReady(t *testing.T) {
	env := newTestEnv()
	const kindReady = 40
	ready := func(c *Client) bool {
		_, err := c.Region().Get(kindReady, "ready", nil)
		return err == nil
	}
	o1 := newTestOwner(t, env.ownerOpts())
	_, err := o1.Region().Put(kindReady, "ready", []byte{1})
	require.NoError(t, err)
	f, err := Follow(FollowOptions{Client: env.clientOpts(), Poll: 2 * time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Ready: ready})
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, o1.Close())
	require.Eventually(t, f.Dead, 5*time.Second, time.Millisecond)

	o2 := newTestOwner(t, env.ownerOpts())
	time.Sleep(100 * time.Millisecond)
	require.True(t, f.Dead(), "switched to an owner that is not ready")
	require.Equal(t, uint64(1), f.Generation())
	_, err = o2.Region().Put(kindReady, "ready", []byte{1})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.Generation() == 2 && !f.Dead() }, 5*time.Second, time.Millisecond)
	require.Equal(t, o2.Region().ID(), f.Client().Region().ID())

	// Follow itself waits for Ready, up to the client timeout.
	o3env := newTestEnv()
	newTestOwner(t, o3env.ownerOpts())
	opts := o3env.clientOpts()
	opts.Timeout = time.Second // each attach's bound too: a loaded machine needs more than 50 ms
	_, err = Follow(FollowOptions{Client: opts, Ready: ready})
	require.ErrorIs(t, err, ErrTimeout)
}
