package ipc

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// nobodyCred runs a helper process as uid and gid 65534.
var nobodyCred = &syscall.Credential{Uid: nobody, Gid: nobody}

// nobodyExe copies the test binary where uid 65534 can run it (it sits in a private build
// directory) and returns the copy's path; the test is skipped without root.
func nobodyExe(t *testing.T) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to run helper processes as uid 65534")
	}
	dir, err := os.MkdirTemp("", "shmsteer-uid-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	exe := filepath.Join(dir, "ipc.test")
	src, err := os.Open(os.Args[0])
	require.NoError(t, err)
	dst, err := os.OpenFile(exe, os.O_CREATE|os.O_WRONLY, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, errors.Join(src.Close(), dst.Close()))
	return exe
}
