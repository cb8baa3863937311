package proto

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestTables reads this package's constants from its source (codes_gen.go included) and checks
// that no two kinds, ops or error codes share a number, that kinds fit 16 bits, that ops stay
// at or below MaxUserOp (but for the replies) and that codes stay below MinUserCode: a new entry
// that reuses a number fails here, not in a worker that misreads a region or a reply. It does
// not check a room's block: each room's error codes are checked against its wire-range line by
// capi/internal/errtable when errors.tab is parsed.
func TestTables(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	bounds := map[string]bool{"MinUserOp": true, "MaxUserOp": true, "MinUserCode": true}
	seen := map[string]map[int64]string{}
	n := 0
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, sp := range gd.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, name := range vs.Names {
					var prefix string
					for _, p := range []string{"Kind", "Op", "Code"} {
						if strings.HasPrefix(name.Name, p) {
							prefix = p
						}
					}
					if prefix == "" || bounds[name.Name] {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok {
						t.Fatalf("%s: want a literal number", name.Name)
					}
					v, err := strconv.ParseInt(lit.Value, 0, 64)
					if err != nil {
						t.Fatal(err)
					}
					if seen[prefix] == nil {
						seen[prefix] = map[int64]string{}
					}
					if other, dup := seen[prefix][v]; dup {
						t.Errorf("%s and %s are both %d", other, name.Name, v)
					}
					seen[prefix][v] = name.Name
					n++
					switch {
					case prefix == "Kind" && (v <= 0 || v > 0xffff):
						t.Errorf("%s = %d: kinds are 1..65535", name.Name, v)
					case prefix == "Code" && v >= int64(MinUserCode):
						t.Errorf("%s = %d: the module's codes are below MinUserCode", name.Name, v)
					case prefix == "Op" && v > int64(MaxUserOp) && v != int64(OpReplyOK) && v != int64(OpReplyErr):
						t.Errorf("%s = %d: above MaxUserOp", name.Name, v)
					}
				}
			}
		}
	}
	if n < 40 {
		t.Fatalf("read only %d constants: the parser missed the tables", n)
	}
}

var (
	errA = errors.New("a")
	errB = fmt.Errorf("b wraps %w", errA)
)

// A later Bind wins over an earlier one; within one Bind the first match wins; a code decodes
// to an error that matches its sentinel and keeps the owner's message; an unbound code decodes
// to an error that matches nothing and says so with Known.
func TestCodec(t *testing.T) {
	Bind(Pair{200, errA})
	Bind(Pair{201, errB}, Pair{202, errA})
	if c := CodeOf(fmt.Errorf("x: %w", errB)); c != 201 {
		t.Fatalf("CodeOf(errB) = %d, want 201 (the later, more specific binding)", c)
	}
	if c := CodeOf(errA); c != 202 {
		t.Fatalf("CodeOf(errA) = %d, want 202", c)
	}
	if c := CodeOf(errors.New("other")); c != CodeOther {
		t.Fatalf("CodeOf(unbound) = %d", c)
	}
	re := Decode(201, "owner said b")
	if !errors.Is(re, errB) || !errors.Is(re, errA) || re.Error() != "owner said b" || !re.Known() {
		t.Fatalf("Decode(201) = %v", re)
	}
	if re := Decode(250, "?"); re.Known() || errors.Is(re, errA) {
		t.Fatalf("Decode(unbound) = %#v", re)
	}
	for _, bad := range [][]Pair{{{200, errB}}, {{203, nil}}, {{CodeOther, errA}}, {{204, errA}, {204, errB}}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Bind(%v) did not panic", bad)
				}
			}()
			Bind(bad...)
		}()
	}
}
