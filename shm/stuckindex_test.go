//go:build linux

package shm

import (
	"bufio"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestIndexFullNamesStuckReader: deleted keys keep their index words while a stopped reader
// process pins an old version; the ErrRegionFull this ends in names that reader (pid, version)
// and the remedy, instead of only "raise Config.IndexSlots". Ending the process frees the words.
func TestIndexFullNamesStuckReader(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 64, ArenaBytes: 4 << 20, ReaderSlots: 16})
	_, err := r.Put(testKind, "k", []byte("v"))
	require.NoError(t, err)
	cmds, pinned := startStuckReader(t, r)

	var full error
	for i := 0; i < 10000 && full == nil; i++ {
		key := fmt.Sprint("key-", i)
		if _, full = r.Put(testKind, key, []byte("x")); full == nil {
			_, full = r.Delete(testKind, key)
		}
	}
	require.ErrorIs(t, full, ErrRegionFull)
	msg := full.Error()
	require.Contains(t, msg, "index")
	require.Contains(t, msg, fmt.Sprintf("pid %d", cmds[0].Process.Pid))
	require.Contains(t, msg, fmt.Sprintf("pinned at version %d", pinned))
	require.Contains(t, msg, "stuck")

	cleared := r.Stats().DeadCleared
	require.NoError(t, cmds[0].Process.Signal(syscall.SIGKILL))
	cmds[0].Wait()
	_, err = r.SweepReaders() // or the writes' background pass, which scans the slots too, did
	require.NoError(t, err)
	require.Equal(t, cleared+1, r.Stats().DeadCleared, "the killed reader's slot, freed once")
	require.NoError(t, r.Reclaim()) // what the owner's periodic sweep runs
	_, err = r.Put(testKind, "after", []byte("x"))
	require.NoError(t, err, "the words come back once the reader is gone")
}

// startStuckReader starts a reader child that pins the current version and is then stopped
// (SIGSTOP), lets the owner's scan see the pin age, and returns the child and its version.
func startStuckReader(t *testing.T, r *Region) ([]*exec.Cmd, uint64) {
	t.Helper()
	cmds := startChildren(t, r, "pin-stop", 1)
	out, err := cmds[0].StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmds[0].Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, line)
	var pinned uint64
	_, err = fmt.Sscanf(line, "READY %d", &pinned)
	require.NoError(t, err)
	require.NoError(t, cmds[0].Process.Signal(syscall.SIGSTOP))
	_, err = r.SweepReaders() // the owner's periodic scan sees the pin
	require.NoError(t, err)
	time.Sleep(30 * time.Millisecond) // and it ages
	return cmds, pinned
}
