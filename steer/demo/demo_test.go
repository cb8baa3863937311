package demo

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	RunWorkerIfRequested() // the demo re-executes this test binary as its workers
	os.Exit(m.Run())
}

func TestDemoSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	var out, errb bytes.Buffer
	code := Main([]string{"-workers", "2", "-steps", "12", "-hidden", "64", "-layers", "2", "-tokens", "16", "-requests", "6"}, &out, &errb)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	require.Contains(t, out.String(), "checksums agree")
	require.Contains(t, out.String(), `"attached_clients": 2`)
}

func TestDemoBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 2, Main([]string{"-workers", "0"}, &out, &errb))
	require.Equal(t, 2, Main([]string{"extra"}, &out, &errb))
}
