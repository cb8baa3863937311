package steer

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// steerKindLo and steerKindHi bound steer's block of region kinds in internal/proto.
const steerKindLo, steerKindHi = 16, 31

// TestDocKinds checks doc.go's list of the kinds steer stores ("KindX (n)") against
// internal/proto's kind table: every kind of steer's block is listed with its number, and
// every kind doc.go names is proto's, with proto's number.
func TestDocKinds(t *testing.T) {
	table := protoKinds(t, "../internal/proto/proto.go")
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]int64{}
	for _, m := range regexp.MustCompile(`\b(Kind\w+) \((\d+)\)`).FindAllStringSubmatch(string(doc), -1) {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		if prev, dup := listed[m[1]]; dup && prev != n {
			t.Errorf("doc.go gives %s as both %d and %d", m[1], prev, n)
		}
		listed[m[1]] = n
		if want, ok := table[m[1]]; !ok {
			t.Errorf("doc.go lists %s (%d), which internal/proto does not have", m[1], n)
		} else if want != n {
			t.Errorf("doc.go lists %s (%d); internal/proto has %d", m[1], n, want)
		}
	}
	steerKinds := 0
	for name, v := range table {
		if v < steerKindLo || v > steerKindHi {
			continue
		}
		steerKinds++
		if _, ok := listed[name]; !ok {
			t.Errorf("doc.go does not list %s (%d), a kind of steer's block", name, v)
		}
	}
	if steerKinds < 4 {
		t.Fatalf("found %d kinds in steer's block of internal/proto: the parser missed the table", steerKinds)
	}
}

// protoKinds reads the Kind* constants of the proto source file at path.
func protoKinds(t *testing.T, path string) map[string]int64 {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, sp := range gd.Specs {
			vs := sp.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Kind") || i >= len(vs.Values) {
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
				out[name.Name] = v
			}
		}
	}
	return out
}
