package bench

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseSmaps(t *testing.T) {
	const smaps = `55d4c0a00000-55d4c0a21000 r--p 00000000 08:01 1234   /usr/bin/shmsteer
Size:                132 kB
Rss:                 132 kB
Pss:                  66 kB
7f0000000000-7f0004000000 rw-s 00000000 00:01 99     /memfd:shmsteer-data (deleted)
Size:              65536 kB
Pss:                1000 kB
Pss_Dirty:          1000 kB
7f1000000000-7f1000021000 rw-p 00000000 00:00 0
Pss:                  12 kB
VmFlags: rd wr mr mw me ac sd
`
	p, err := parseSmaps([]byte(smaps))
	require.NoError(t, err)
	require.Equal(t, pss{total: (66 + 1000 + 12) << 10, memfd: 1000 << 10}, p)

	_, err = parseSmaps([]byte("7f1000000000-7f1000021000 rw-p 00000000 00:00 0\nPss: lots kB\n"))
	require.ErrorContains(t, err, "smaps")

	self, err := readPss(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, self.total)
}

func TestParseRollupOwn(t *testing.T) {
	const rollup = `00400000-7ffc0d658000 ---p 00000000 00:00 0                              [rollup]
Rss:                9000 kB
Pss:                6000 kB
Pss_Dirty:          3000 kB
Pss_Anon:           2792 kB
Pss_File:           1664 kB
Pss_Shmem:          1544 kB
Shared_Clean:        100 kB
`
	own, err := parseRollupOwn([]byte(rollup))
	require.NoError(t, err)
	require.Equal(t, int64(2792+1664), own, "anonymous and file-backed, not the region's shmem")

	_, err = parseRollupOwn([]byte("Pss_Anon: lots kB\n"))
	require.ErrorContains(t, err, "smaps_rollup")

	buf := make([]byte, 4096)
	self, err := ownPss(buf)
	require.NoError(t, err)
	require.Positive(t, self)
}

// TestSettleRuntime: settling stops once the process's own Pss held still over
// tp8StableCycles cycles, and within tp8MaxCycles.
func TestSettleRuntime(t *testing.T) {
	cycles := settleRuntime()
	require.GreaterOrEqual(t, cycles, tp8StableCycles+1)
	require.LessOrEqual(t, cycles, tp8MaxCycles)
}
