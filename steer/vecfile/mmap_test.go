package vecfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMappedFileTruncatedWhileRead: a file shrunk by another process while it is mapped makes
// the next read of a vanished page fault (SIGBUS); the guard turns it into ErrCorrupt instead
// of killing the process.
func TestMappedFileTruncatedWhileRead(t *testing.T) {
	page := os.Getpagesize()
	path := filepath.Join(t.TempDir(), "f.gguf")
	require.NoError(t, os.WriteFile(path, make([]byte, 4*page), 0o644))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	m, err := mapFile(f, int64(4*page))
	require.NoError(t, err)
	defer m.close()
	require.NoError(t, os.Truncate(path, 0))

	var sink byte
	err = m.guard(path, func() error {
		sink += m.data[3*page]
		return nil
	})
	require.ErrorIs(t, err, ErrCorrupt)
	require.Contains(t, err.Error(), "changed while it was read")

	// A panic that is not a memory fault is not swallowed.
	require.Panics(t, func() { _ = m.guard(path, func() error { panic("other") }) })
	_ = sink
}
