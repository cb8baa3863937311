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
