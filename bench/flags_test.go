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
		opts Options
		want []string
	}{
		"plot txt":          {Options{Only: "keys.get.gomap", Plot: filepath.Join(dir, "x.txt")}, []string{"--plot", "x.txt", ".png or .svg"}},
		"plot no ext":       {Options{Plot: filepath.Join(dir, "chart")}, []string{".png or .svg"}},
		"only nosuch":       {Options{Only: "nosuch"}, []string{`--only "nosuch" matches no figure`, "keys.get.gomap_ns"}},
		"only near":         {Options{Only: "keys.get.x,kernels.mul"}, []string{"matches no figure"}},
		"only empty":        {Options{Only: " , "}, []string{"matches no figure"}},
		"rounds -1":         {Options{Rounds: -1}, []string{"--rounds -1"}},
		"summarize and run": {Options{Summarize: "a.json", Only: "keys."}, []string{"--summarize runs nothing"}},
		"summarize nothing": {Options{Summarize: " , "}, []string{"no runs to summarize"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := runMain(tc.opts, sources{}, &out, &errb)
			require.ErrorIs(t, err, ErrUsage)
			require.Empty(t, out.String(), "nothing ran")
			require.Empty(t, errb.String(), "nothing ran")
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

// When stderr is not a terminal the progress line carries no escapes: one plain line per
// update.
func TestProgressWithoutTerminal(t *testing.T) {
	var out, errb bytes.Buffer
	require.NoError(t, runMain(Options{Quick: true, Rounds: 1, Only: "keys.get.gomap"}, sources{}, &out, &errb), errb.String())
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
