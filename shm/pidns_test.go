//go:build linux

package shm

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Workers in containers run in PID namespaces of their own, with their own /proc or with the
// host's. These tests run the reader processes of the kill tests that way.

const mountProcEnv = "SHMSTEER_SHM_MOUNTPROC"

// mountOwnProc gives this process (pid 1 of a new PID and mount namespace) a /proc of its own
// namespace, as `unshare --pid --fork --mount-proc` does.
func mountOwnProc() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	return unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

type nsMode struct {
	name    string
	ownProc bool
}

var nsModes = []nsMode{{"host-proc", false}, {"own-proc", true}}

// inPIDNamespace makes cmds start in a new PID namespace (and mount namespace with a /proc of
// their own if ownProc); it skips the test where the kernel does not let us.
func inPIDNamespace(t *testing.T, ownProc bool, cmds ...*exec.Cmd) {
	t.Helper()
	flags := uintptr(syscall.CLONE_NEWPID)
	if ownProc {
		flags |= syscall.CLONE_NEWNS
	}
	probe := exec.Command(os.Args[0], "-test.run=^$")
	probe.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
	if err := probe.Run(); err != nil {
		t.Skipf("cannot start a process in a new PID namespace here (%v): needs root or user namespaces", err)
	}
	for _, c := range cmds {
		c.SysProcAttr.Cloneflags = flags
		if ownProc {
			c.Env = append(c.Env, mountProcEnv+"=1")
		}
	}
}

// childHoldLease pins a snapshot, tells the parent its lease word and pid, then holds and reads
// snapshots like childHold until it is killed.
func childHoldLease(r *Region) int {
	s, err := r.Snapshot()
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Printf("READY %d %d\n", r.me, os.Getpid())
	s.Close()
	return childHold(r)
}

// childPinStop pins a snapshot and never closes it: a stuck worker.
func childPinStop(r *Region) int {
	s, err := r.Snapshot()
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Printf("READY %d\n", s.Version())
	select {}
}

// slotDump describes every claimed slot, for failure messages.
func slotDump(r *Region) string {
	var b strings.Builder
	for i := uint64(0); i < r.l.readerSlots; i++ {
		o := slotOff(i)
		if w := load64(r.readers, o+slotOwner); w != 0 {
			fmt.Fprintf(&b, "[slot %d owner %#x pin %d pid %d held %v] ", i, w, load64(r.readers, o+slotPin), load64(r.readers, o+slotPID), slotHeld(r.files[1], o))
		}
	}
	return b.String()
}

func slotsOf(r *Region, lease uint64) int {
	n := 0
	for i := uint64(0); i < r.l.readerSlots; i++ {
		if load64(r.readers, slotOff(i)+slotOwner) == lease {
			n++
		}
	}
	return n
}

// TestKillReadersPIDNamespace is TestKillReaders with every reader in a PID namespace of its
// own: verifying readers must see no torn value while holders are SIGKILLed at random points,
// and a killed holder's slots must be freed within a second. With pid-based liveness the owner
// cleared live slots of own-proc readers (torn reads) and never freed host-proc ones.
func TestKillReadersPIDNamespace(t *testing.T) {
	for _, mode := range nsModes {
		t.Run(mode.name, func(t *testing.T) {
			r := smallRegion(t)
			require.NoError(t, writeGeneration(r, 1))
			const stop = 300
			verifiers := startChildren(t, r, "verify", 2, "SHMSTEER_SHM_STOP="+strconv.Itoa(stop))
			holders := startChildren(t, r, "hold-lease", 3)
			inPIDNamespace(t, mode.ownProc, append(verifiers, holders...)...)
			outs := make([]*strings.Builder, len(verifiers))
			for i, c := range verifiers {
				outs[i] = &strings.Builder{}
				c.Stdout = outs[i]
				require.NoError(t, c.Start())
			}
			leases := make([]uint64, len(holders))
			for i, c := range holders {
				out, err := c.StdoutPipe()
				require.NoError(t, err)
				require.NoError(t, c.Start())
				line, err := bufio.NewReader(out).ReadString('\n')
				require.NoError(t, err)
				var pid int
				_, err = fmt.Sscanf(line, "READY %d %d", &leases[i], &pid)
				require.NoError(t, err, line)
				require.Equal(t, 1, pid, "the holder is pid 1 of its own namespace")
				require.GreaterOrEqual(t, slotsOf(r, leases[i]), 1)
			}
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
			killAt := map[uint64]int{} // generation → holder, one holder per generation
			for i := range holders {
				g := uint64(10 + rng.IntN(stop-40))
				for _, taken := killAt[g]; taken; _, taken = killAt[g] {
					g++
				}
				killAt[g] = i
			}
			require.Len(t, killAt, len(holders), "every holder is killed")
			var worst time.Duration
			for gen := uint64(2); gen <= stop+20; gen++ {
				require.Eventually(t, func() bool {
					err := writeGeneration(r, gen)
					if errors.Is(err, ErrRegionFull) {
						r.SweepReaders() // the owner's periodic sweep (ipc runs one every 250 ms)
						return false
					}
					require.NoError(t, err)
					return true
				}, 10*time.Second, time.Millisecond)
				if i, ok := killAt[gen]; ok {
					c := holders[i]
					killed := time.Now()
					require.NoError(t, c.Process.Signal(syscall.SIGKILL))
					require.Error(t, c.Wait())
					for slotsOf(r, leases[i]) != 0 {
						require.Less(t, time.Since(killed), time.Second, "a killed reader's slots are freed within a second")
						time.Sleep(5 * time.Millisecond)
						_, err := r.SweepReaders()
						require.NoError(t, err)
					}
					worst = max(worst, time.Since(killed))
				}
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
			}
			for i, c := range verifiers {
				err := c.Wait()
				require.NoError(t, err, "verifier %d: %s", i, outs[i].String())
				require.Contains(t, outs[i].String(), "OK", "no torn read: %s", outs[i].String())
			}
			t.Logf("%s: slots of killed readers freed within %v (sweeping every 5 ms)", mode.name, worst)
			ok := assert.Eventually(t, func() bool {
				r.SweepReaders()
				require.NoError(t, r.Reclaim())
				st := r.Stats()
				return st.ReadersClaimed == 0 && st.RetiredBytes == 0
			}, 10*time.Second, 10*time.Millisecond)
			if !ok {
				t.Fatalf("not everything reclaimed: %+v; slots: %s", r.Stats(), slotDump(r))
			}
		})
	}
}

// TestStuckReaderVisible: a worker that pins a snapshot and stops holds reclamation back. Stats
// must name it (pid, version, age), and the ErrRegionFull it causes must say so.
func TestStuckReaderVisible(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 1024, ArenaBytes: 256 << 10, ReaderSlots: 16})
	_, err := r.Put(testKind, "k", make([]byte, 1000))
	require.NoError(t, err)
	cmds, pinned := startStuckReader(t, r)

	var full error
	for i := 0; i < 10000 && full == nil; i++ {
		_, full = r.Put(testKind, "k", make([]byte, 1000+i%7))
	}
	require.ErrorIs(t, full, ErrRegionFull)
	msg := full.Error()
	require.Contains(t, msg, "arena")
	require.Contains(t, msg, fmt.Sprintf("pid %d", cmds[0].Process.Pid))
	require.Contains(t, msg, fmt.Sprintf("pinned at version %d", pinned))
	require.Contains(t, msg, "stuck")

	st := r.Stats()
	require.Equal(t, pinned, st.OldestPin.Version)
	require.Equal(t, cmds[0].Process.Pid, st.OldestPin.PID)
	require.Greater(t, st.OldestPin.Age, 20*time.Millisecond)

	// The remedy: end the process; its slot is freed and writes go on. The sweep frees it unless
	// the writes' background reclamation pass, which scans the slots too, got there first.
	cleared := r.Stats().DeadCleared
	require.NoError(t, cmds[0].Process.Signal(syscall.SIGKILL))
	cmds[0].Wait()
	_, err = r.SweepReaders()
	require.NoError(t, err)
	require.Equal(t, cleared+1, r.Stats().DeadCleared, "the killed reader's slot, freed once")
	require.Zero(t, r.Stats().ReadersClaimed)
	_, err = r.Put(testKind, "k", make([]byte, 1000))
	require.NoError(t, err)
	require.Zero(t, r.Stats().OldestPin.Version)
}
