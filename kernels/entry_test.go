package kernels

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestCurIDFirst pins what AddRows's assembly entry (addRowsEntry, kernels_amd64.s) assumes:
// the path id is cur's first word, blocksFrom its second, pairs the byte after and ymmFrom
// its fourth.
func TestCurIDFirst(t *testing.T) {
	require.Zero(t, unsafe.Offsetof(impl{}.id))
	require.Equal(t, cur.id, *(*int)(unsafe.Pointer(&cur)))
	// addRowsAVX512Body reads blocksFrom as the second, pairs as the byte after it, ymmFrom as
	// the fourth.
	require.Equal(t, unsafe.Sizeof(int(0)), unsafe.Offsetof(impl{}.blocksFrom))
	require.Equal(t, 2*unsafe.Sizeof(int(0)), unsafe.Offsetof(impl{}.pairs))
	require.Equal(t, 3*unsafe.Sizeof(int(0)), unsafe.Offsetof(impl{}.ymmFrom))
}
