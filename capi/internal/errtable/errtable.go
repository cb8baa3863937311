// Package errtable reads capi/errors.tab, the one source table of the module's error codes (the
// C ABI's and the wire's), and renders every table made from it: the SHMSTEER_E_* codes of
// shmsteer_errors.h (included by shmsteer.h), capi's Go table of sentinels (errors_gen.go), the C table behind
// shmsteer_error_name (errnames_gen.c), the Python exception classes (python/shmsteer/errors.py
// and its parts, see python.go), internal/proto's wire codes (codes_gen.go) and each binding
// package's proto.Bind (wire_gen.go, see wire.go).
//
// It owns the table's syntax (documented at the top of errors.tab) and its checks: unique
// codes, names and classes, codes inside their package's range, Python bases that exist. It
// must not know any sentinel's value (capi's tests check those against the table) and it does
// not build anything.
//
// Start with capi/errgen.go, which `go generate ./capi` runs: Outputs reads errors.tab from a
// capi directory and returns each generated file.
package errtable

import (
	"bytes"
	"cmp"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Package is a package line: the Go package whose sentinels get codes First..Last. A package
// may have several lines, one per block of codes (a package that took over another's
// sentinels keeps their codes).
type Package struct {
	Name  string // the Go package name, the prefix of its sentinels' names ("ipc")
	Path  string // its import path; "." for capi itself
	First int
	Last  int
}

// Row is one code.
type Row struct {
	Code     int
	Name     string   // the SHMSTEER_E_ suffix
	Pkg      string   // the package's name
	Sentinel string   // the sentinel's identifier ("ErrKeyRevoked")
	PyClass  string   // the Python exception class
	PyBases  []string // its bases after ShmsteerError or a table class
	Doc      string   // what it means (may be empty)
	Line     int      // where in errors.tab
}

// GoName is the name shmsteer_error_name reports: "ipc.ErrOwnerGone".
func (r Row) GoName() string { return r.Pkg + "." + r.Sentinel }

// Retired is a code no longer returned, kept out of use.
type Retired struct {
	Code int
	Doc  string
}

// Table is errors.tab parsed.
type Table struct {
	Packages []Package
	Rows     []Row // in the file's order, which is the match order
	Retired  []Retired
	Limit    int

	Wires      []Wire      // in code order
	Locals     []Local     // in name order
	WireRanges []WireRange // the codes each binding package may use
	binders    map[string]string
}

// pyBuiltins are the built-in exceptions a row may name as a base.
var pyBuiltins = map[string]bool{"ValueError": true, "LookupError": true, "KeyError": true,
	"ConnectionError": true, "PermissionError": true, "TimeoutError": true, "OSError": true}

// pyGroups are the hand-written base classes of the Python template a row may name.
var pyGroups = map[string]bool{"VectorFileError": true}

var (
	identRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	cNameRE  = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	rangeRE  = regexp.MustCompile(`^(\d+)-(\d+)$`)
	pyDeclRE = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)(?:\(([A-Za-z0-9_,]+)\))?$`)
)

// Parse reads errors.tab and checks it.
func Parse(src []byte) (*Table, error) {
	t := &Table{}
	for i, line := range strings.Split(string(src), "\n") {
		n := i + 1
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		bad := func(format string, args ...any) error {
			return fmt.Errorf("errors.tab:%d: %s", n, fmt.Sprintf(format, args...))
		}
		if isWireLine(f[0]) {
			if err := t.parseWireLine(f, n); err != nil {
				return nil, bad("%v", err)
			}
			continue
		}
		switch f[0] {
		case "package":
			if len(f) != 4 {
				return nil, bad("want: package NAME IMPORT-PATH FIRST-LAST")
			}
			m := rangeRE.FindStringSubmatch(f[3])
			if m == nil || !identRE.MatchString(f[1]) {
				return nil, bad("bad package line %q", line)
			}
			first, _ := strconv.Atoi(m[1])
			last, _ := strconv.Atoi(m[2])
			t.Packages = append(t.Packages, Package{Name: f[1], Path: f[2], First: first, Last: last})
		case "limit":
			v, err := strconv.Atoi(strings.Join(f[1:], ""))
			if err != nil || len(f) != 2 {
				return nil, bad("want: limit N")
			}
			t.Limit = v
		case "retired":
			if len(f) < 2 {
				return nil, bad("want: retired CODE what it was")
			}
			v, err := strconv.Atoi(f[1])
			if err != nil {
				return nil, bad("bad code %q", f[1])
			}
			t.Retired = append(t.Retired, Retired{Code: v, Doc: strings.Join(f[2:], " ")})
		default:
			r, err := parseRow(f)
			if err != nil {
				return nil, bad("%v", err)
			}
			r.Line = n
			t.Rows = append(t.Rows, r)
		}
	}
	if err := t.check(); err != nil {
		return nil, err
	}
	if err := t.checkWire(); err != nil {
		return nil, err
	}
	return t, nil
}

func parseRow(f []string) (Row, error) {
	if len(f) < 4 {
		return Row{}, fmt.Errorf("want: code NAME pkg.ErrSentinel PythonClass(Bases) doc")
	}
	code, err := strconv.Atoi(f[0])
	if err != nil {
		return Row{}, fmt.Errorf("bad code %q", f[0])
	}
	if !cNameRE.MatchString(f[1]) {
		return Row{}, fmt.Errorf("bad C name %q (upper case, the SHMSTEER_E_ suffix)", f[1])
	}
	pkg, sentinel, ok := strings.Cut(f[2], ".")
	if !ok || !identRE.MatchString(pkg) || !identRE.MatchString(sentinel) || !strings.HasPrefix(sentinel, "Err") {
		return Row{}, fmt.Errorf("bad sentinel %q (want pkg.ErrName)", f[2])
	}
	m := pyDeclRE.FindStringSubmatch(f[3])
	if m == nil || !strings.HasSuffix(m[1], "Error") {
		return Row{}, fmt.Errorf("bad Python class %q (want NameError or NameError(Base,Base))", f[3])
	}
	var bases []string
	if m[2] != "" {
		bases = strings.Split(m[2], ",")
	}
	return Row{Code: code, Name: f[1], Pkg: pkg, Sentinel: sentinel, PyClass: m[1], PyBases: bases,
		Doc: strings.Join(f[4:], " ")}, nil
}

func (t *Table) check() error {
	if t.Limit <= 0 {
		return fmt.Errorf("errors.tab: no limit line")
	}
	pkgs := map[string][]Package{} // a package's blocks
	for i, p := range t.Packages {
		if prev := pkgs[p.Name]; len(prev) > 0 && prev[0].Path != p.Path {
			return fmt.Errorf("errors.tab: package %s with two import paths", p.Name)
		}
		if p.First < 1 || p.Last < p.First || p.Last >= t.Limit {
			return fmt.Errorf("errors.tab: package %s: range %d-%d outside 1-%d", p.Name, p.First, p.Last, t.Limit-1)
		}
		for j, q := range t.Packages {
			if i != j && p.First <= q.Last && q.First <= p.Last {
				return fmt.Errorf("errors.tab: packages %s and %s have overlapping ranges", p.Name, q.Name)
			}
		}
		pkgs[p.Name] = append(pkgs[p.Name], p)
	}
	codes := map[int]string{}
	for _, r := range t.Retired {
		if prev, dup := codes[r.Code]; dup {
			return fmt.Errorf("errors.tab: code %d twice (%s)", r.Code, prev)
		}
		codes[r.Code] = "retired"
	}
	names := map[string]bool{}
	sentinels := map[string]bool{}
	classes := map[string]bool{}
	for _, r := range t.Rows {
		at := func(format string, args ...any) error {
			return fmt.Errorf("errors.tab:%d: %s", r.Line, fmt.Sprintf(format, args...))
		}
		blocks, ok := pkgs[r.Pkg]
		if !ok {
			return at("package %s has no package line", r.Pkg)
		}
		if !slices.ContainsFunc(blocks, func(p Package) bool { return r.Code >= p.First && r.Code <= p.Last }) {
			var ranges []string
			for _, p := range blocks {
				ranges = append(ranges, fmt.Sprintf("%d-%d", p.First, p.Last))
			}
			return at("code %d is outside package %s's range %s", r.Code, r.Pkg, strings.Join(ranges, ", "))
		}
		if prev, dup := codes[r.Code]; dup {
			return at("code %d is already %s", r.Code, prev)
		}
		codes[r.Code] = r.GoName()
		if names[r.Name] {
			return at("SHMSTEER_E_%s twice", r.Name)
		}
		names[r.Name] = true
		if sentinels[r.GoName()] {
			return at("%s twice", r.GoName())
		}
		sentinels[r.GoName()] = true
		if classes[r.PyClass] || pyGroups[r.PyClass] || pyBuiltins[r.PyClass] {
			return at("Python class %s twice", r.PyClass)
		}
		classes[r.PyClass] = true
	}
	for _, r := range t.Rows {
		for i, b := range r.PyBases {
			switch {
			case pyBuiltins[b]:
			case (classes[b] || pyGroups[b]) && i == 0:
			case classes[b] || pyGroups[b]:
				return fmt.Errorf("errors.tab:%d: %s: the shmsteer base %s comes first", r.Line, r.PyClass, b)
			default:
				return fmt.Errorf("errors.tab:%d: %s: unknown base %s", r.Line, r.PyClass, b)
			}
		}
	}
	// A parent chain that loops would never finish defining.
	for _, r := range t.Rows {
		seen := map[string]bool{}
		for c, ok := r, true; ok; c, ok = t.parentRow(c) {
			if seen[c.PyClass] {
				return fmt.Errorf("errors.tab:%d: %s: its bases loop", r.Line, r.PyClass)
			}
			seen[c.PyClass] = true
		}
	}
	return nil
}

// parentRow is the row of r's first base when that base is a class of the table.
func (t *Table) parentRow(r Row) (Row, bool) {
	if len(r.PyBases) == 0 {
		return Row{}, false
	}
	for _, p := range t.Rows {
		if p.PyClass == r.PyBases[0] {
			return p, true
		}
	}
	return Row{}, false
}

// Parent is the Go name of the sentinel whose Python class is r's shmsteer base, or "".
func (t *Table) Parent(r Row) string {
	if p, ok := t.parentRow(r); ok {
		return p.GoName()
	}
	return ""
}

// byCode is the rows sorted by code.
func (t *Table) byCode() []Row {
	rows := slices.Clone(t.Rows)
	slices.SortFunc(rows, func(a, b Row) int { return cmp.Compare(a.Code, b.Code) })
	return rows
}

// Package returns the package line of name.
func (t *Table) Package(name string) (Package, bool) {
	for _, p := range t.Packages {
		if p.Name == name {
			return p, true
		}
	}
	return Package{}, false
}

const generated = "Code generated by capi/errgen.go from capi/errors.tab; DO NOT EDIT."

// Go renders capi's table of sentinels, in match order.
func (t *Table) Go() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "// %s\n\npackage main\n\n/*\n#include \"shmsteer.h\"\n*/\nimport \"C\"\n\n", generated)
	var imports []string
	for _, p := range t.Packages {
		if p.Path != "." {
			imports = append(imports, p.Path)
		}
	}
	slices.Sort(imports)
	b.WriteString("import (\n")
	for _, p := range imports {
		fmt.Fprintf(&b, "\t%q\n", p)
	}
	b.WriteString(")\n\n")
	b.WriteString("// errorCodes lists every code of errors.tab in its order, which is the match order: codeOf\n")
	b.WriteString("// returns the code of the first row whose sentinel errors.Is finds.\n")
	b.WriteString("var errorCodes = []errorCode{\n")
	for _, r := range t.Rows {
		val := r.GoName()
		if p, _ := t.Package(r.Pkg); p.Path == "." {
			val = r.Sentinel
		}
		fmt.Fprintf(&b, "\t{C.SHMSTEER_E_%s, %q, %s},\n", r.Name, r.GoName(), val)
	}
	b.WriteString("}\n")
	out, err := format.Source(b.Bytes())
	if err != nil {
		panic(fmt.Sprintf("errtable: the generated Go does not parse: %v", err))
	}
	return out
}

// C renders the C table behind shmsteer_error_name.
func (t *Table) C() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "//go:build cgo\n\n// %s\n\n", generated)
	b.WriteString("// shmsteer_error_name: the Go name of each code (static storage, no call into Go, so it\n")
	b.WriteString("// works in a forked child).\n\n")
	b.WriteString("#include \"shmsteer.h\"\n\n")
	b.WriteString("static const char *const shmsteer_error_names[SHMSTEER_E_LIMIT] = {\n")
	b.WriteString("    [SHMSTEER_OK] = \"ok\",\n")
	for _, r := range t.byCode() {
		fmt.Fprintf(&b, "    [SHMSTEER_E_%s] = %q,\n", r.Name, r.GoName())
	}
	b.WriteString("};\n\n")
	b.WriteString("__attribute__((visibility(\"default\"))) const char *shmsteer_error_name(int code) {\n")
	b.WriteString("  if (code < 0 || code >= SHMSTEER_E_LIMIT) return (const char *)0;\n")
	b.WriteString("  return shmsteer_error_names[code];\n}\n")
	return b.Bytes()
}

// ErrorsHeader renders shmsteer_errors.h, the SHMSTEER_E_* codes that shmsteer.h includes (the
// meaning of the codes is documented there, beside the #include).
func (t *Table) ErrorsHeader() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "/* %s */\n", generated)
	b.WriteString("/* The error codes of the C ABI: include shmsteer.h, which includes this file. */\n")
	b.WriteString("#ifndef SHMSTEER_ERRORS_H\n#define SHMSTEER_ERRORS_H\n\n")
	b.WriteString("#define SHMSTEER_OK 0\n")
	type item struct {
		code      int
		def, note string
	}
	var items []item
	for _, r := range t.Rows {
		note := r.GoName()
		if r.Doc != "" {
			note += ": " + r.Doc
		}
		items = append(items, item{r.Code, fmt.Sprintf("#define SHMSTEER_E_%s %d", r.Name, r.Code), note})
	}
	for _, r := range t.Retired {
		items = append(items, item{r.Code, "", fmt.Sprintf("%d: retired (%s)", r.Code, r.Doc)})
	}
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.code, b.code) })
	pkgs := slices.Clone(t.Packages)
	slices.SortFunc(pkgs, func(a, b Package) int { return cmp.Compare(a.First, b.First) })
	for _, p := range pkgs {
		fmt.Fprintf(&b, "/* package %s (codes %d..%d) */\n", p.Name, p.First, p.Last)
		width := 0
		for _, it := range items {
			if it.code >= p.First && it.code <= p.Last {
				width = max(width, len(it.def))
			}
		}
		for _, it := range items {
			if it.code < p.First || it.code > p.Last {
				continue
			}
			if it.def == "" {
				fmt.Fprintf(&b, "/* %s */\n", it.note)
				continue
			}
			fmt.Fprintf(&b, "%-*s /* %s */\n", width, it.def, it.note)
		}
	}
	b.WriteString("/* One past the largest code. */\n")
	fmt.Fprintf(&b, "#define SHMSTEER_E_LIMIT %d\n", t.Limit)
	b.WriteString("\n#endif /* SHMSTEER_ERRORS_H */\n")
	return []byte(b.String())
}

// Outputs reads errors.tab from the capi directory dir and returns every generated file by its
// path relative to dir.
func Outputs(dir string) (map[string][]byte, error) {
	src, err := os.ReadFile(filepath.Join(dir, "errors.tab"))
	if err != nil {
		return nil, err
	}
	t, err := Parse(src)
	if err != nil {
		return nil, err
	}
	mod, err := os.ReadFile(filepath.Join(dir, "..", "go.mod"))
	if err != nil {
		return nil, err
	}
	module := modfile(mod)
	if module == "" {
		return nil, fmt.Errorf("go.mod: no module line")
	}
	out := map[string][]byte{
		"shmsteer_errors.h": t.ErrorsHeader(),
		"errors_gen.go":     t.Go(),
		"errnames_gen.c":    t.C(),
		filepath.Join("..", "internal", "proto", "codes_gen.go"): t.Proto(),
	}
	py, err := t.Python()
	if err != nil {
		return nil, err
	}
	for name, src := range py {
		out[filepath.Join("..", "python", "shmsteer", name)] = src
	}
	for d, src := range t.Binds(module) {
		out[filepath.Join("..", filepath.FromSlash(d), "wire_gen.go")] = src
	}
	return out, nil
}

// modfile is the module path of a go.mod.
func modfile(src []byte) string {
	for _, line := range strings.Split(string(src), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return f[1]
		}
	}
	return ""
}
