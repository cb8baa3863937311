package bench

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Bad --plot names and --only prefixes that match nothing are usage errors, found before
// anything runs (nothing on stdout).
func TestMainRejectsBeforeRunning(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]struct {
		args []string
		want []string
	}{
		"plot txt":    {[]string{"--only", "keys.get.gomap", "--plot", filepath.Join(dir, "x.txt")}, []string{"--plot", "x.txt", ".png or .svg"}},
		"plot no ext": {[]string{"--plot", filepath.Join(dir, "chart")}, []string{".png or .svg"}},
		"only nosuch": {[]string{"--only", "nosuch"}, []string{`--only "nosuch" matches no figure`, "keys.get.gomap_ns"}},
		"only near":   {[]string{"--only", "keys.get.x,kernels.mul"}, []string{"matches no figure"}},
		"only empty":  {[]string{"--only", " , "}, []string{"matches no figure"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			require.Equal(t, 2, Main(tc.args, Sources{}, &out, &errb))
			require.Empty(t, out.String(), "nothing ran")
			for _, w := range tc.want {
				require.Contains(t, errb.String(), w)
			}
		})
	}
}

// When stderr is not a terminal the progress line carries no escapes: one plain line per
// update.
func TestProgressWithoutTerminal(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, Main([]string{"--quick", "--rounds", "1", "--only", "keys.get.gomap"}, Sources{}, &out, &errb), errb.String())
	require.NotContains(t, errb.String(), "\033")
	require.NotContains(t, errb.String(), "\r")
	require.Contains(t, errb.String(), "[1/1] keys.get.gomap_ns setup\n")
	for _, line := range strings.Split(strings.TrimSuffix(errb.String(), "\n"), "\n") {
		require.True(t, strings.HasPrefix(line, "["), "progress line %q", line)
	}
	require.Contains(t, out.String(), "keys.get.gomap_ns")

	var plain bytes.Buffer
	w := progressWriter(&plain)
	_, _ = w.Write([]byte("\r\033[K[1/2] a setup"))
	_, _ = w.Write([]byte("\r\033[K"))
	require.Equal(t, "[1/2] a setup\n", plain.String())
}
