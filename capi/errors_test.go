//go:build cgo

package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/capi/internal/errtable"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
)

func readErrorTable(t *testing.T) *errtable.Table {
	t.Helper()
	src, err := os.ReadFile("errors.tab")
	require.NoError(t, err)
	tab, err := errtable.Parse(src)
	require.NoError(t, err)
	return tab
}

// exportedSentinels lists pkg.ErrX for every exported package-level variable named Err* in the
// non-test Go files of dir.
func exportedSentinels(t *testing.T, pkg, dir string) []string {
	t.Helper()
	var names []string
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		if f.Name.Name != pkg && !(pkg == "capi" && f.Name.Name == "main") {
			continue // errgen.go and other ignored files of another package
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, sp := range gd.Specs {
				for _, n := range sp.(*ast.ValueSpec).Names {
					if strings.HasPrefix(n.Name, "Err") && n.IsExported() {
						names = append(names, pkg+"."+n.Name)
					}
				}
			}
		}
	}
	return names
}

// Every exported sentinel of a package errors.tab lists has a row, and every row's sentinel
// exists: the Go table (errors_gen.go), the C names (errnames_gen.c, through
// shmsteer_error_name) and errors.tab agree code by code.
func TestErrorTableCoversSentinels(t *testing.T) {
	tab := readErrorTable(t)
	var want []string
	seen := map[string]bool{}
	for _, p := range tab.Packages {
		if seen[p.Name] { // another block of codes of a package already listed
			continue
		}
		seen[p.Name] = true
		dir := "."
		if p.Path != "." {
			dir = filepath.Join("..", strings.TrimPrefix(p.Path, "github.com/shmsteer/shmsteer/"))
		}
		want = append(want, exportedSentinels(t, p.Name, dir)...)
	}
	// ipc.ErrClosed is shm.ErrClosed itself (one value, one code).
	require.Equal(t, ipc.ErrClosed, shm.ErrClosed)
	want = slices.DeleteFunc(want, func(s string) bool { return s == "ipc.ErrClosed" })
	var fromTable []string
	for _, r := range tab.Rows {
		fromTable = append(fromTable, r.GoName())
	}
	slices.Sort(want)
	slices.Sort(fromTable)
	require.Equal(t, want, fromTable, "every sentinel has a row of errors.tab (add one, then go generate ./capi)")

	require.Len(t, errorCodes, len(tab.Rows), "errors_gen.go is stale: go generate ./capi")
	for i, r := range tab.Rows {
		c := errorCodes[i]
		require.Equal(t, r.Code, int(c.code), "row %d of errors_gen.go", i)
		require.Equal(t, r.GoName(), c.name, "row %d of errors_gen.go", i)
		require.Equal(t, r.GoName(), cErrorName(r.Code), "C name of code %d", r.Code)
		require.Equal(t, r.Code, int(codeOf(fmt.Errorf("context: %w", c.err))), "code of a wrapped %s", c.name)
	}
	for code := 1; code < errorCodeLimit; code++ {
		require.Equal(t, errorNameOf(code), cErrorName(code), "code %d", code)
	}
	require.Equal(t, tab.Limit, errorCodeLimit)
}

// The generated files are what errors.tab renders to today: a row added to the table but not
// generated (or a generated file edited by hand) fails here.
func TestErrorTablesGenerated(t *testing.T) {
	out, err := errtable.Outputs(".")
	require.NoError(t, err)
	tab := readErrorTable(t)
	py, err := tab.Python()
	require.NoError(t, err)
	require.Len(t, out, 4+len(py)+len(tab.BindDirs()), "the C and proto tables, errors.py and its parts, and each binding package's wire_gen.go")
	// A part no longer generated (its package's codes gone) is stale too.
	parts, err := filepath.Glob(filepath.Join("..", "python", "shmsteer", "_errors_*.py"))
	require.NoError(t, err)
	for _, p := range parts {
		require.Contains(t, out, p, "%s is not generated from errors.tab any more: remove it", p)
	}
	for path, want := range out {
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		if w, g := string(want), string(got); w != g {
			wl, gl := strings.Split(w, "\n"), strings.Split(g, "\n")
			i := 0
			for i < len(wl) && i < len(gl) && wl[i] == gl[i] {
				i++
			}
			line := func(l []string) string {
				if i < len(l) {
					return l[i]
				}
				return "(end of file)"
			}
			t.Errorf("%s is stale (run go generate ./capi): line %d is\n\t%s\nwant\n\t%s", path, i+1, line(gl), line(wl))
		}
	}
}

// Match order: no row is shadowed by an earlier one (a sentinel that wraps another comes
// first), and the Python hierarchy is errors.Is's: a class derives from the class of each
// sentinel its own sentinel matches, and from no other shmsteer class.
func TestErrorTableOrderAndHierarchy(t *testing.T) {
	tab := readErrorTable(t)
	byName := map[string]errtable.Row{}
	for _, r := range tab.Rows {
		byName[r.GoName()] = r
	}
	ancestors := func(r errtable.Row) []string {
		var a []string
		for p := tab.Parent(r); p != ""; p = tab.Parent(byName[p]) {
			a = append(a, p)
		}
		return a
	}
	for i, a := range errorCodes {
		var matches []string
		for j, b := range errorCodes {
			if i == j || !errors.Is(a.err, b.err) {
				continue
			}
			require.Less(t, i, j, "%s matches %s, so its row must come first in errors.tab", a.name, b.name)
			matches = append(matches, b.name)
		}
		got := ancestors(byName[a.name])
		slices.Sort(matches)
		slices.Sort(got)
		require.Equal(t, matches, got, "Python bases of %s from errors.tab: the classes of the sentinels it matches", byName[a.name].PyClass)
	}
}
