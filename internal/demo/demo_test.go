package demo

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	RunWorkerIfRequested() // the demo re-executes this test binary as its workers
	os.Exit(m.Run())
}

// mainArgs runs Main with the options args sets on BindFlags' defaults, as `shmsteer demo`
// does (its cobra command parses the same flag set; positional arguments are refused there).
func mainArgs(t *testing.T, args []string, stdout, stderr *bytes.Buffer) error {
	t.Helper()
	fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
	o := BindFlags(fs)
	require.NoError(t, fs.Parse(args))
	return Main(*o, stdout, stderr)
}

func TestDemoSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	var out, errb bytes.Buffer
	err := mainArgs(t, []string{"--workers", "2", "--steps", "40", "--hidden", "64", "--layers", "2", "--tokens", "16", "--requests", "6", "--max-latched-bytes", "300"}, &out, &errb)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	require.Contains(t, out.String(), "checksums agree")
	require.Contains(t, out.String(), `"attached_clients": 2`)
	require.Contains(t, out.String(), "2 workers,")
	// The latch warnings of a normal run say they are what the run demonstrates.
	warned := false
	for _, line := range strings.Split(errb.String(), "\n") {
		// The library's warnings: "... exceeds max_latched_bytes ...; not latched", "latch of
		// conversation ... dropped".
		if strings.Contains(line, "max_latched_bytes") || strings.Contains(line, "latch of conversation") {
			warned = true
			require.Contains(t, line, "demonstrated", line)
		}
	}
	require.True(t, warned, "this run shows latch warnings:\n%s", errb.String())
	require.Contains(t, errb.String(), "not faults")
}

func TestDemoOneWorkerGrammar(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	var out, errb bytes.Buffer
	err := mainArgs(t, []string{"--workers", "1", "--steps", "3", "--hidden", "16", "--layers", "1", "--tokens", "4", "--requests", "2"}, &out, &errb)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	require.Contains(t, out.String(), "1 worker,")
	require.Contains(t, errb.String(), "1 worker attached (1 client)")
	require.NotContains(t, out.String()+errb.String(), "1 workers")
	require.NotContains(t, out.String()+errb.String(), "1 clients")
}

func TestDemoBadFlags(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"workers 0":   {[]string{"--workers", "0"}, "--workers must be at least 1 (got 0)"},
		"tokens 0":    {[]string{"--tokens", "0"}, "--tokens must be at least 1 (got 0)"},
		"steps -1":    {[]string{"--steps", "-1"}, "--steps must be at least 1 (got -1)"},
		"latch bytes": {[]string{"--max-latched-bytes", "0"}, "--max-latched-bytes must be at least 1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := mainArgs(t, tc.args, &out, &errb)
			require.ErrorIs(t, err, ErrUsage)
			require.ErrorContains(t, err, tc.want)
			require.Empty(t, out.String())
			require.Empty(t, errb.String())
		})
	}
}
