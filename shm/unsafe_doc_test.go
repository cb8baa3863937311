package shm

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestUnsafeFilesListed checks unsafe.go's list of the files that import unsafe against the
// tree: every non-test Go file that imports it matches a listed path (a capi/*.go pattern
// counts), and every listed path matches such a file.
func TestUnsafeFilesListed(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "unsafe.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var doc strings.Builder
	for _, g := range f.Comments {
		if g.Pos() < f.Imports[0].Pos() { // the comments above the imports
			doc.WriteString(g.Text())
		}
	}
	listed := regexp.MustCompile(`[\w.]+(?:/[\w.*]+)+\.go`).FindAllString(doc.String(), -1)
	if len(listed) < 5 {
		t.Fatalf("unsafe.go's doc lists %d paths (%q): the list was not found", len(listed), listed)
	}
	importers := unsafeImporters(t, "..")
	used := map[string]bool{}
	for _, file := range importers {
		named := false
		for _, pat := range listed {
			if ok, _ := filepath.Match(pat, file); ok {
				named, used[pat] = true, true
			}
		}
		if !named {
			t.Errorf("%s imports unsafe but unsafe.go's doc does not list it", file)
		}
	}
	for _, pat := range listed {
		if !used[pat] {
			t.Errorf("unsafe.go's doc lists %s, which names no non-test file importing unsafe", pat)
		}
	}
}

// unsafeImporters returns the non-test Go files under root that import unsafe, relative to
// root, skipping python/, testdata and hidden directories.
func unsafeImporters(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "python") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		if importsUnsafe(f) {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("found no file importing unsafe: the walk missed the tree")
	}
	return out
}

func importsUnsafe(f *ast.File) bool {
	for _, im := range f.Imports {
		if p, err := strconv.Unquote(im.Path.Value); err == nil && p == "unsafe" {
			return true
		}
	}
	return false
}
