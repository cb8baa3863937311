package serve

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// `shmsteer status` prints gate_work (and every other object) one leaf per line, not as a Go
// map literal ("gate_work  map[engaged:map[...] ...]").
func TestPrintStatusReadable(t *testing.T) {
	f := startForkServer(t, "status-print", nil)
	cs, err := AttachClient(f.ns, f.secret)
	require.NoError(t, err)
	defer cs.Close()
	var b bytes.Buffer
	require.NoError(t, cs.PrintStatus(&b, false))
	out := b.String()
	require.NotContains(t, out, "map[", out)
	require.Regexp(t, `(?m)^gate_work\.evaluations\.this_token\s+0$`, out)
	require.Regexp(t, `(?m)^gate_work\.workers\s+0$`, out)
	require.Regexp(t, `(?m)^named_vectors\s+0$`, out)
}
