package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
)

// runServeExpectFail runs serve on dir and requires that it refuses to start; it returns the
// exit code and stderr.
func runServeExpectFail(t *testing.T, ns, dir string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a serve that starts is killed
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "serve", "--http", "127.0.0.1:0", "--namespace", ns, "--hidden", fmt.Sprint(e2eHidden),
		"--layers", fmt.Sprint(e2eLayers), "--arena-bytes", fmt.Sprint(64<<20), "--state-dir", dir)
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NotContains(t, stdout.String(), "listening on", "serve started:\n%s", stderr.String())
	ee, ok := err.(*exec.ExitError)
	require.True(t, ok && ctx.Err() == nil, "serve started: %v\n%s", err, stderr.String())
	return ee.ExitCode(), stderr.String()
}

// The state directory's lock is a flock on the directory itself: deleting a lock file inside
// (the old lock) does not let a second serve in. Before, the second serve started on the same
// state directory once the lock file was removed.
func TestServeStateLockSurvivesDeletedLockFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir)
	populate(t, s)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if e.Name() == "lock" {
			require.NoError(t, os.Remove(filepath.Join(dir, "lock")))
		}
	}
	_, msg := runServeExpectFail(t, ns(t)+"-second", dir)
	require.Contains(t, msg, "state directory in use by another process")
	require.NoError(t, s.stop(syscall.SIGTERM))
	s = startServe(t, ns(t), dir)
	require.NoError(t, s.stop(syscall.SIGTERM))
}

// serve refuses a state directory, state file or vector file that another uid owns or that
// group or others can write (it restores whatever is there), and removes the temporary files
// that saves interrupted by a crash left. Before, a state file written by another uid was
// restored and temporary files piled up.
func TestServeStateDirMustBePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := startServe(t, ns(t), dir)
	populate(t, s)
	before := snapshotState(s)
	require.NoError(t, s.stop(syscall.SIGTERM))
	state := filepath.Join(dir, "state.bin")
	ents, err := os.ReadDir(filepath.Join(dir, "vectors"))
	require.NoError(t, err)
	require.NotEmpty(t, ents)
	vector := filepath.Join(dir, "vectors", ents[0].Name())

	refused := func(what, want string) {
		t.Helper()
		code, msg := runServeExpectFail(t, ns(t), dir)
		require.Equal(t, 1, code, what)
		require.Contains(t, msg, "state directory not private", what)
		require.Contains(t, msg, want, what)
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{dir, 0o770}, {dir, 0o703}, {state, 0o620}, {state, 0o602}, {vector, 0o666}} {
		fi, err := os.Stat(c.path)
		require.NoError(t, err)
		require.NoError(t, os.Chmod(c.path, c.mode))
		refused(fmt.Sprintf("%s mode %v", c.path, c.mode), "writable by group or others")
		require.NoError(t, os.Chmod(c.path, fi.Mode().Perm()))
	}
	if os.Geteuid() == 0 {
		for _, p := range []string{dir, state, vector} {
			require.NoError(t, os.Lchown(p, 65534, 65534))
			refused(p+" owned by uid 65534", "belongs to uid 65534")
			require.NoError(t, os.Lchown(p, 0, 0))
		}
	} else {
		t.Log("foreign-owned files skipped: chown needs root (the mode checks above ran)")
	}
	require.NoError(t, os.Rename(state, state+".real"))
	require.NoError(t, os.Symlink(state+".real", state))
	refused("state.bin a symlink", "not a regular file")
	require.NoError(t, os.Remove(state))
	require.NoError(t, os.Rename(state+".real", state))

	// Leftovers of interrupted saves (writeAtomic's temporary files) are removed at start.
	var tmps []string
	for i := range 6 {
		tmps = append(tmps, filepath.Join(dir, fmt.Sprintf("state.bin.tmp-%d", 1000+i)),
			filepath.Join(dir, "vectors", fmt.Sprintf("%s.tmp-%d", ents[0].Name(), 2000+i)))
	}
	for _, p := range tmps {
		require.NoError(t, os.WriteFile(p, []byte("partial"), 0o600))
	}
	s = startServe(t, ns(t), dir)
	for _, p := range tmps {
		require.NoFileExists(t, p)
	}
	require.Contains(t, s.stderr.String(), "removed temporary files of interrupted saves")
	require.Equal(t, before, snapshotState(s), "the state is restored whole")
	require.NoError(t, s.stop(syscall.SIGTERM))
}
