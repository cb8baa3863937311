package errtable

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// moduleRoot is the module's directory, from this package's (capi/internal/errtable).
const moduleRoot = "../../.."

var sentinelRE = regexp.MustCompile(`^Err[A-Z0-9]`)

// moduleSentinels lists DIR.ErrX for every exported package-level variable named Err* in the
// non-test Go files of every package of the module under root (files built by no build, like
// generators under //go:build ignore, are not the package's).
func moduleSentinels(t *testing.T, root string) []string {
	t.Helper()
	var names []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "python" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(src, []byte("\n//go:build ignore\n")) || bytes.HasPrefix(src, []byte("//go:build ignore\n")) {
			return nil
		}
		f, err := parser.ParseFile(fset, p, src, 0)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(rel)
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, sp := range gd.Specs {
				for _, n := range sp.(*ast.ValueSpec).Names {
					if sentinelRE.MatchString(n.Name) {
						names = append(names, dir+"."+n.Name)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func readTable(t *testing.T) *Table {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(moduleRoot, "capi", "errors.tab"))
	if err != nil {
		t.Fatal(err)
	}
	tab, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// Every exported sentinel of every package of the module (shm, ipc, keys, steer, capture, serve,
// mirror, the tools) has a wire line (an owner's reply carries it as that code) or a local line
// (with the reason none does), and every such line names a sentinel that exists: a new sentinel
// fails here until errors.tab says which it is.
func TestWireTableCoversModule(t *testing.T) {
	tab := readTable(t)
	have := moduleSentinels(t, moduleRoot)
	if len(have) < 100 {
		t.Fatalf("found only %d sentinels: the walk missed the module", len(have))
	}
	listed := tab.Sentinels()
	for _, s := range have {
		if _, ok := slices.BinarySearch(listed, s); !ok {
			t.Errorf("%s has no wire or local line in capi/errors.tab (bind it to a code or say why it stays local), then go generate ./capi", s)
		}
	}
	for _, s := range listed {
		if _, ok := slices.BinarySearch(have, s); !ok {
			t.Errorf("capi/errors.tab names %s, which the module does not declare", s)
		}
	}
}

// The wire lines' checks refuse what would break the codes: a code or constant twice, a
// sentinel with two lines, a code outside its binder's range, lines out of order.
func TestWireTableChecks(t *testing.T) {
	base := "limit 10\npackage capi . 1-9\nwire-range ipc 1-31\nwire-range steer 32-63\nwire-binder shm ipc\n"
	for _, c := range []struct{ name, lines, want string }{
		{"code twice", "wire 1 A ipc.ErrA\nwire 1 B ipc.ErrB\n", "wire code 1 twice"},
		{"const twice", "wire 1 A ipc.ErrA\nwire 2 A ipc.ErrB\n", "constant CodeA twice"},
		{"wire and local", "wire 1 A ipc.ErrA\nlocal ipc.ErrA why\n", "two wire or local lines"},
		{"out of range", "wire 32 A ipc.ErrA\n", "outside every wire-range of ipc"},
		{"binder's range", "wire 33 A shm.ErrA\n", "outside every wire-range of ipc, which binds shm.ErrA"},
		{"by code", "wire 2 A ipc.ErrA\nwire 1 B ipc.ErrB\n", "wire lines go by code"},
		{"by name", "local ipc.ErrB why\nlocal ipc.ErrA why\n", "local lines go by name"},
		{"no reason", "local ipc.ErrA\n", "want: local"},
		{"limit", "wire 256 A ipc.ErrA\n", "bad wire code"},
		{"not a sentinel", "local ipc.Foo why\n", "bad sentinel"},
	} {
		_, err := Parse([]byte(base + c.lines))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Parse = %v, want an error with %q", c.name, err, c.want)
		}
	}
	tab, err := Parse([]byte(base + "wire 1 A ipc.ErrA\nwire 2 B shm.ErrB\nwire 32 C steer.ErrC\nlocal steer/vecfile.ErrD why\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Binder("shm"); got != "ipc" {
		t.Errorf("Binder(shm) = %s", got)
	}
	binds := tab.Binds("example.com/m")
	if len(binds) != 2 || !bytes.Contains(binds["ipc"], []byte("proto.Pair{Code: proto.CodeB, Err: shm.ErrB}")) ||
		!bytes.Contains(binds["ipc"], []byte(`"example.com/m/shm"`)) {
		t.Errorf("Binds:\n%s", binds["ipc"])
	}
}

// The wire files are what errors.tab renders to today (capi's TestErrorTablesGenerated checks
// every output where cgo builds), and no package keeps a wire_gen.go the table no longer
// renders (its bindings would outlive their lines).
func TestWireFilesGenerated(t *testing.T) {
	out, err := Outputs(filepath.Join(moduleRoot, "capi"))
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range out {
		if !strings.HasSuffix(p, "wire_gen.go") && !strings.HasSuffix(p, "codes_gen.go") {
			continue
		}
		got, err := os.ReadFile(filepath.Join(moduleRoot, "capi", p))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale (go generate ./capi): %v", p, err)
		}
	}
	tab := readTable(t)
	err = filepath.WalkDir(moduleRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "wire_gen.go" {
			return err
		}
		rel, _ := filepath.Rel(moduleRoot, filepath.Dir(p))
		if !slices.Contains(tab.BindDirs(), filepath.ToSlash(rel)) {
			t.Errorf("%s: errors.tab binds nothing in %s any more: remove the file", p, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
