package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPythonPathNotes: the Python key figures' notes name the path each op's gets took, as the
// worker's ready line reports it, ahead of a note they had; a skipped figure and the group's
// other figures are left alone, and a worker that reported nothing says so.
func TestPythonPathNotes(t *testing.T) {
	s := &shared{info: "python 3.12.3, /usr/bin/python3; op get: the _fastkeys extension, through the thread's reader (the C reader answers live keys); op getctypes: ctypes, through the thread's reader (the C reader answers live keys)"}
	ops := map[string]string{"keys.get.python_ns": "get", "keys.get.python_ctypes_ns": "getctypes"}
	figs := s.notePaths(ops)([]figure{
		{Name: "keys.get.python_ns", Note: "earlier"},
		{Name: "keys.get.python_ctypes_ns"},
		{Name: "keys.get.capi_ns"},
	})
	require.Equal(t, "get path: the _fastkeys extension, through the thread's reader (the C reader answers live keys); earlier", figs[0].Note)
	require.Equal(t, "get path: ctypes, through the thread's reader (the C reader answers live keys)", figs[1].Note)
	require.Empty(t, figs[2].Note)
	figs = (&shared{}).notePaths(ops)([]figure{{Name: "keys.get.python_ns"}, {Name: "keys.get.python_ctypes_ns", Skipped: "no python"}})
	require.Equal(t, "get path: not reported by the worker", figs[0].Note)
	require.Empty(t, figs[1].Note)
	require.Equal(t, []figure{{Name: "x", Note: "a"}}, thenPost(nil, func(f []figure) []figure { f[0].Note = "a"; return f })([]figure{{Name: "x"}}))
}

// TestPythonKeysDriver runs python_keys_bench.py against the library built in the repository:
// its ready line names the path of each op (get: the package's keys[id]; getctypes: ctypes),
// both through the worker thread's reader, and both ops run.
func TestPythonKeysDriver(t *testing.T) {
	if _, err := pythonDir(); err != nil {
		t.Skipf("%v", err)
	}
	if _, err := findPython(""); err != nil {
		t.Skipf("python3 not available: %v", err)
	}
	pk := newPythonKeys()
	p, release, err := pk.acquire()
	require.NoError(t, err)
	t.Cleanup(func() { _ = release() })
	t.Log(p.Info)
	get, ctypes := opPath(p.Info, "get"), opPath(p.Info, "getctypes")
	require.Regexp(t, `^(the _fastkeys extension|ctypes)`, get)
	require.Regexp(t, `^ctypes`, ctypes)
	for _, path := range []string{get, ctypes} {
		require.Contains(t, path, "through the thread's reader (the C reader answers live keys)")
	}
	for _, op := range []string{"get", "getctypes"} {
		_, err := p.Run(op, 20)
		require.NoError(t, err, op)
	}
}
