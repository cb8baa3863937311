package shmlayout

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The generated files are what the table renders to today: a row changed but not generated, or
// a generated file edited by hand, fails here (run `go generate ./shm`).
func TestLayoutGenerated(t *testing.T) {
	out, err := Outputs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(Generated) {
		t.Fatalf("%d outputs, want %v", len(out), Generated)
	}
	for p, want := range out {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate ./shm", p)
		}
	}
}

// The descriptor's rows fit in descSize, do not overlap, and the seeds fill the rest exactly.
func TestDescriptorRows(t *testing.T) {
	var rows []Const
	for _, g := range Groups {
		for _, r := range g.Rows {
			if len(r.Go) > 1 && r.Go[0] == 'd' && r.Go[1] >= 'A' && r.Go[1] <= 'Z' {
				rows = append(rows, r)
			}
		}
	}
	var size, seeds, kinds uint64
	for _, g := range Groups {
		for _, r := range g.Rows {
			switch r.Go {
			case "descSize":
				size = r.Val
			case "dSeeds":
				seeds = r.Val
			case "seededKinds":
				kinds = r.Val
			}
		}
	}
	if seeds+8*kinds != size {
		t.Fatalf("dSeeds %d + 8*seededKinds %d != descSize %d", seeds, kinds, size)
	}
	used := map[uint64]string{}
	for _, r := range rows {
		if r.Val%8 != 0 || r.Val >= size {
			t.Errorf("%s = %d: not a word inside the descriptor", r.Go, r.Val)
		}
		if o, dup := used[r.Val]; dup {
			t.Errorf("%s and %s share offset %d", o, r.Go, r.Val)
		}
		used[r.Val] = r.Go
	}
	if len(rows) < 10 {
		t.Fatalf("found %d descriptor rows", len(rows))
	}
}

// A broken table is refused: a repeated name, a C name without its prefix.
func TestTableChecks(t *testing.T) {
	saved := Groups
	defer func() { Groups = saved }()
	Groups = []Group{{"x", []Const{{"a", "SHM_A", 1, ""}, {"a", "SHM_B", 2, ""}}}}
	if _, err := Outputs("."); err == nil {
		t.Error("a repeated Go name was accepted")
	}
	Groups = []Group{{"x", []Const{{"a", "A", 1, ""}}}}
	if _, err := Outputs("."); err == nil {
		t.Error("a C name without SHM_ was accepted")
	}
}

// The Go reader and the C reader are one source: every function of reader.go.in is in
// shm/reader_gen.go as written there (the Go rendering is the source itself) and in
// capi/shmread_gen.h as shm_<name>, no other function of shm or capi's C files carries one of
// those names or the hash's constants (no hand-written second reader beside them), and a change
// to the source changes both renderings.
func TestReaderOneSource(t *testing.T) {
	srcFuncs := funcNames(t, readerGo)
	if len(srcFuncs) < 5 {
		t.Fatalf("reader.go.in has only %v", srcFuncs)
	}
	genGo, err := os.ReadFile("../../shm/reader_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if got := funcNames(t, string(genGo)); strings.Join(got, ",") != strings.Join(srcFuncs, ",") {
		t.Fatalf("shm/reader_gen.go has %v, the source %v", got, srcFuncs)
	}
	genC, err := os.ReadFile("../../capi/shmread_gen.h")
	if err != nil {
		t.Fatal(err)
	}
	_, translated, ok := strings.Cut(string(genC), "translated from internal/shmlayout/reader.go.in")
	if !ok {
		t.Fatal("capi/shmread_gen.h has no translated part")
	}
	for _, f := range srcFuncs {
		if !regexp.MustCompile(`(?m)^static inline \w+ shm_` + f + `\([^;]*\) \{$`).MatchString(translated) {
			t.Errorf("capi/shmread_gen.h does not define shm_%s from the source", f)
		}
	}
	// Nothing else defines them: shm's hand-written Go, capi's C and Go files.
	defs := map[string]bool{}
	for _, f := range srcFuncs {
		defs[f] = true
	}
	shmFiles, _ := filepath.Glob("../../shm/*.go")
	for _, p := range shmFiles {
		if filepath.Base(p) == "reader_gen.go" || strings.HasSuffix(p, "_test.go") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range funcNames(t, string(b)) {
			if defs[f] {
				t.Errorf("%s defines %s, which the generated reader holds", p, f)
			}
		}
	}
	cFiles, _ := filepath.Glob("../../capi/*.[ch]")
	for _, p := range cFiles {
		if filepath.Base(p) == "shmread_gen.h" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if regexp.MustCompile(`SHM_PRIME|__int128|SHM_INDEX_FP_SHIFT`).Match(b) {
			t.Errorf("%s hashes or probes by hand", p)
		}
	}
	// A change to the source reaches both renderings.
	saved := readerGo
	defer func() { readerGo = saved }()
	before, err := Outputs("r")
	if err != nil {
		t.Fatal(err)
	}
	readerGo = strings.Replace(saved, "r := fold(x^a, y^b^n)", "r := fold(x^b, y^a^n)", 1)
	if readerGo == saved {
		t.Fatal("the mutation did not apply: update the test with the source")
	}
	after, err := Outputs("r")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"r/shm/reader_gen.go", "r/capi/shmread_gen.h"} {
		if bytes.Equal(before[p], after[p]) {
			t.Errorf("%s did not change with the source", p)
		}
	}
	if !bytes.Contains(after["r/capi/shmread_gen.h"], []byte("uint64_t r = shm_fold((x ^ b), ((y ^ a) ^ n));")) {
		t.Error("the C rendering does not carry the source's change")
	}
}

func funcNames(t *testing.T, src string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
			names = append(names, fd.Name.Name)
		}
	}
	return names
}

// The translation refuses what it does not know rather than guess its C meaning.
func TestToCRefuses(t *testing.T) {
	consts := map[string]string{"bKey": "SHM_B_KEY"}
	for _, src := range []string{
		"package shm\nfunc f(a int) uint64 { return 0 }",                        // a parameter type
		"package shm\nfunc f(a uint64) uint64 { return -a }",                    // unary minus
		"package shm\nfunc f(a uint64) uint64 { return nope }",                  // an unknown name
		"package shm\nfunc f(a uint64) uint64 { b := a == 1; _ = b; return a }", // a bool variable
		"package shm\nfunc f(a uint64) (x, y uint64) { return g(a) }\nfunc g(a uint64) uint64 { return a }",
		"package shm\nfunc f(a uint64) uint64 { switch a {}; return a }", // a switch
		"package shm\nfunc f(m *rmem) uint64 { return m.nope }",          // a field without a row
		"package shm\nvar v uint64",                                      // a declaration
	} {
		if out, err := toC(src, consts); err == nil {
			t.Errorf("translated %q to %q", src, out)
		}
	}
	out, err := toC("package shm\nfunc f(a uint64, k []byte) uint64 { return a&^bKey<<2 + uint64(len(k)) }", consts)
	if err != nil || !strings.Contains(out, "return (((a & ~SHM_B_KEY) << UINT64_C(2)) + (uint64_t)(k_len));" /* Go's precedence */) {
		t.Errorf("got %q, %v", out, err)
	}
}
