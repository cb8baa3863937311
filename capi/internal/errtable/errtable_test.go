package errtable

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const good = `
package capi . 1-9
package shm github.com/shmsteer/shmsteer/shm 10-29
limit 100
retired 12 shm.ErrGone, never returned
1 FORKED capi.ErrForked ForkedError forked after load
10 NOT_FOUND shm.ErrNotFound NotFoundError(LookupError)
11 MARKED shm.ErrMarked MarkedError(NotFoundError)
`

func TestParseAndRender(t *testing.T) {
	tab, err := Parse([]byte(good))
	require.NoError(t, err)
	require.Len(t, tab.Rows, 3)
	require.Equal(t, "shm.ErrNotFound", tab.Parent(tab.Rows[2]))
	require.Equal(t, "", tab.Parent(tab.Rows[1]))

	h := string(tab.ErrorsHeader())
	require.Contains(t, h, "#define SHMSTEER_E_MARKED 11    /* shm.ErrMarked */")
	require.Contains(t, h, "/* 12: retired (shm.ErrGone, never returned) */")
	require.Contains(t, h, "#define SHMSTEER_E_LIMIT 100\n\n#endif /* SHMSTEER_ERRORS_H */\n")
	require.True(t, strings.HasPrefix(h, "/* "+generated+" */\n"), "marked generated")

	files, err := tab.Python()
	require.NoError(t, err)
	require.Equal(t, []string{"_errors_base.py", "_errors_capi.py", "_errors_shm.py", "errors.py"}, sortedNames(files))
	py := string(files["_errors_shm.py"])
	require.Contains(t, py, "from ._errors_base import ShmsteerError\n")
	require.Contains(t, py, "class MarkedError(NotFoundError):")
	require.Contains(t, py, "class NotFoundError(ShmsteerError, LookupError):")
	require.Less(t, strings.Index(py, "class NotFoundError"), strings.Index(py, "class MarkedError"))
	index := string(files["errors.py"])
	require.Contains(t, index, "from ._errors_shm import (\n    NotFoundError,\n    MarkedError,\n)\n")
	require.Contains(t, index, "    11: MarkedError,\n")
	require.Contains(t, string(tab.Go()), `{C.SHMSTEER_E_FORKED, "capi.ErrForked", ErrForked},`)
	require.Contains(t, string(tab.Go()), `{C.SHMSTEER_E_MARKED, "shm.ErrMarked", shm.ErrMarked},`)
	require.Contains(t, string(tab.C()), `[SHMSTEER_E_NOT_FOUND] = "shm.ErrNotFound",`)
}

// A class deriving from another package's imports it from that package's part; packages whose
// classes derive from each other in a loop are refused.
func TestPythonParts(t *testing.T) {
	tab, err := Parse([]byte(good + "package ipc x 30-39\n30 INCOMPATIBLE ipc.ErrIncompatible IncompatibleError(MarkedError)\n"))
	require.NoError(t, err)
	files, err := tab.Python()
	require.NoError(t, err)
	require.Contains(t, string(files["_errors_ipc.py"]), "from ._errors_shm import MarkedError\n")
	require.Contains(t, string(files["_errors_ipc.py"]), "class IncompatibleError(MarkedError):")

	tab, err = Parse([]byte(good + "package ipc x 30-39\n30 A ipc.ErrA AError(MarkedError)\n13 B shm.ErrB BError(AError)\n"))
	require.NoError(t, err)
	_, err = tab.Python()
	require.ErrorContains(t, err, "packages shm -> ipc -> shm derive from each other in a loop")
}

func sortedNames(m map[string][]byte) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func TestParseRefuses(t *testing.T) {
	for name, tc := range map[string]struct{ edit, want string }{
		"code twice":        {"10 OTHER shm.ErrOther OtherError", "code 10 is already shm.ErrNotFound"},
		"retired code":      {"12 OTHER shm.ErrOther OtherError", "code 12 is already retired"},
		"outside range":     {"30 OTHER shm.ErrOther OtherError", "outside package shm's range"},
		"no package line":   {"13 OTHER ipc.ErrOther OtherError", "package ipc has no package line"},
		"C name twice":      {"13 MARKED shm.ErrOther OtherError", "SHMSTEER_E_MARKED twice"},
		"sentinel twice":    {"13 OTHER shm.ErrMarked OtherError", "shm.ErrMarked twice"},
		"class twice":       {"13 OTHER shm.ErrOther MarkedError", "Python class MarkedError twice"},
		"unknown base":      {"13 OTHER shm.ErrOther OtherError(Nope)", "unknown base Nope"},
		"table base second": {"13 OTHER shm.ErrOther OtherError(ValueError,NotFoundError)", "comes first"},
		"not a sentinel":    {"13 OTHER shm.Other OtherError", "want pkg.ErrName"},
		"lower-case C name": {"13 other shm.ErrOther OtherError", "bad C name"},
		"class not Error":   {"13 OTHER shm.ErrOther Other", "bad Python class"},
		"short row":         {"13 OTHER shm.ErrOther", "want: code NAME"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(good + tc.edit + "\n"))
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := Parse([]byte(strings.Replace(good, "limit 100", "", 1)))
	require.ErrorContains(t, err, "no limit line")
	_, err = Parse([]byte(good + "package ipc x 20-39\n"))
	require.ErrorContains(t, err, "overlapping ranges")
	_, err = Parse([]byte(good + "13 A shm.ErrA AError(BError)\n14 B shm.ErrB BError(AError)\n"))
	require.ErrorContains(t, err, "bases loop")
}
