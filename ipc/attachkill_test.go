package ipc

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/shmsteer/shmsteer/internal/proctest"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// attachLoop is the "attachloop" helper role: 4 goroutines attach and detach as fast as they
// can, counting outcomes, until the process is killed. It answers "stats" with
// "ok attached gone notyet timeout other" and, if any, the first other error.
func attachLoop(ns string, say func(string)) {
	var attached, gone, notYet, timeout, other atomic.Int64
	var mu sync.Mutex
	var firstOther string
	for range 4 {
		go func() {
			for {
				c, err := Attach(ClientOptions{Namespace: ns, Timeout: 2 * time.Second})
				switch {
				case err == nil:
					attached.Add(1)
					c.Close()
				case errors.Is(err, ErrOwnerGone) && !errors.Is(err, ErrAuthFailed):
					gone.Add(1)
				case errors.Is(err, ErrNotYetInitialized):
					notYet.Add(1)
					time.Sleep(200 * time.Microsecond)
				case errors.Is(err, ErrTimeout):
					timeout.Add(1)
				default: // ErrAuthFailed included: nobody here has a wrong secret
					other.Add(1)
					mu.Lock()
					if firstOther == "" {
						firstOther = errName(err) + ": " + err.Error()
					}
					mu.Unlock()
				}
			}
		}()
	}
	say("ok ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "stats" {
			mu.Lock()
			say(fmt.Sprintf("ok %d %d %d %d %d %s", attached.Load(), gone.Load(), notYet.Load(), timeout.Load(), other.Load(), firstOther))
			mu.Unlock()
		}
	}
	os.Exit(0)
}

// TestProcAttachDuringOwnerKills: an owner child is SIGKILLed at random points while another
// child attaches in a loop; the attacher restarts each owner's life. Every attach ends in
// success or a typed error (ErrOwnerGone, ErrNotYetInitialized, ErrTimeout; never
// ErrAuthFailed), and the attaching process never panics (a reset read during the welcome used
// to panic in frameReader.next). 200 owner kills (20 with -short).
func TestProcAttachDuringOwnerKills(t *testing.T) {
	kills := 200
	if testing.Short() {
		kills = 20
	}
	env := newTestEnv()
	type loopProc struct {
		p      *proc
		stderr *syncBuffer
	}
	start := func() loopProc {
		cmd := helperCmd(os.Args[0], "attachloop", env.childEnv()...)
		stderr := &syncBuffer{}
		cmd.Stderr = stderr
		p := proctest.Start(t, cmd)
		require.Equal(t, "ok ready", p.Line())
		return loopProc{p, stderr}
	}
	// stats asks the loop for its counts; ok is false if it died.
	stats := func(l loopProc) (fields []string, ok bool) {
		if _, err := fmt.Fprintln(l.p.Stdin, "stats"); err != nil {
			return nil, false
		}
		select {
		case line, open := <-l.p.Lines:
			if !open {
				return nil, false
			}
			return strings.SplitN(line, " ", 7), true
		case <-time.After(30 * time.Second):
			t.Fatal("the attach loop did not answer")
		}
		return nil, false
	}
	var sum [5]int
	reported := 0
	add := func(f []string) {
		for i := range sum {
			var n int
			fmt.Sscan(f[1+i], &n)
			sum[i] += n
		}
		if len(f) == 7 && f[6] != "" && reported < 3 {
			reported++
			t.Errorf("an attach ended in an untyped or wrong error: %s", f[6])
		}
	}
	loop := start()
	var last []string
	panics, deaths := 0, 0
	for i := range kills {
		owner := startProc(t, "owner", env.childEnv()...)
		require.Equal(t, "ok ready", owner.Line(), "owner %d", i)
		time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond)
		owner.Kill()
		f, ok := stats(loop)
		if ok {
			last = f
			continue
		}
		loop.p.Cmd.Wait()
		deaths++
		if strings.Contains(loop.stderr.String(), "panic:") {
			panics++
			if panics == 1 {
				msg := loop.stderr.String()
				t.Logf("first panic: %s", msg[strings.Index(msg, "panic:"):min(len(msg), strings.Index(msg, "panic:")+600)])
			}
		}
		if last != nil {
			add(last)
		}
		last = nil
		loop = start()
	}
	if f, ok := stats(loop); ok {
		add(f)
	}
	t.Logf("%d owner kills: attacher panics %d (deaths %d); attaches ok %d, ErrOwnerGone %d, ErrNotYetInitialized %d, ErrTimeout %d, other %d",
		kills, panics, deaths, sum[0], sum[1], sum[2], sum[3], sum[4])
	require.Zero(t, deaths, "the attaching process died (%d panics)", panics)
	require.Zero(t, sum[4], "attaches ended in untyped or wrong errors")
	require.Positive(t, sum[0], "attaches succeeded between kills")
}
