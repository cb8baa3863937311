package errtable

// The wire side of errors.tab: the code an owner's RPC reply carries for a sentinel
// (internal/proto's Code* constants and each binding package's proto.Bind, rendered into
// internal/proto/codes_gen.go and DIR/wire_gen.go), and the sentinels that never cross a reply,
// each with its reason. The module's every exported sentinel has one line of either kind
// (TestWireTableCoversModule).

import (
	"bytes"
	"cmp"
	"fmt"
	"go/format"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// WireLimit is one past the largest code of the module's rooms: internal/proto's MinUserCode,
// where other programs' codes (ipc.RegisterError) begin.
const WireLimit = 256

// Wire is a wire line: the code an owner's reply carries for a sentinel.
type Wire struct {
	Code     int
	Const    string // internal/proto's constant is "Code" + Const
	Dir      string // the sentinel's package directory in the module ("steer/vecfile")
	Sentinel string // its identifier ("ErrBadName")
	Line     int
}

// Name is the sentinel's name as the wire and local lines write it: "steer/vecfile.ErrShape".
func (w Wire) Name() string { return w.Dir + "." + w.Sentinel }

// Local is a local line: a sentinel no owner's reply carries, and why.
type Local struct {
	Dir      string
	Sentinel string
	Why      string
	Line     int
}

// Name is as Wire.Name.
func (l Local) Name() string { return l.Dir + "." + l.Sentinel }

// WireRange is a wire-range line: the codes the package in Dir binds.
type WireRange struct {
	Dir         string
	First, Last int
}

var (
	dirRE   = regexp.MustCompile(`^[a-z][a-z0-9_]*(/[a-z][a-z0-9_]*)*$`)
	constRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
)

// parseWireLine parses the wire-side line f (its first field says which) into t.
func (t *Table) parseWireLine(f []string, n int) error {
	switch f[0] {
	case "wire":
		if len(f) != 4 {
			return fmt.Errorf("want: wire CODE CONST DIR.ErrSentinel")
		}
		code, err := strconv.Atoi(f[1])
		if err != nil || code <= 0 || code >= WireLimit {
			return fmt.Errorf("bad wire code %q (1..%d)", f[1], WireLimit-1)
		}
		if !constRE.MatchString(f[2]) {
			return fmt.Errorf("bad constant %q (the part after Code)", f[2])
		}
		dir, s, err := splitSentinel(f[3])
		if err != nil {
			return err
		}
		t.Wires = append(t.Wires, Wire{Code: code, Const: f[2], Dir: dir, Sentinel: s, Line: n})
	case "local":
		if len(f) < 3 {
			return fmt.Errorf("want: local DIR.ErrSentinel why it never crosses a reply")
		}
		dir, s, err := splitSentinel(f[1])
		if err != nil {
			return err
		}
		t.Locals = append(t.Locals, Local{Dir: dir, Sentinel: s, Why: strings.Join(f[2:], " "), Line: n})
	case "wire-range":
		m := rangeRE.FindStringSubmatch(f[len(f)-1])
		if len(f) != 3 || m == nil || !dirRE.MatchString(f[1]) {
			return fmt.Errorf("want: wire-range DIR FIRST-LAST")
		}
		first, _ := strconv.Atoi(m[1])
		last, _ := strconv.Atoi(m[2])
		t.WireRanges = append(t.WireRanges, WireRange{Dir: f[1], First: first, Last: last})
	case "wire-binder":
		if len(f) != 3 || !dirRE.MatchString(f[1]) || !dirRE.MatchString(f[2]) {
			return fmt.Errorf("want: wire-binder DIR BINDER-DIR")
		}
		if t.binders == nil {
			t.binders = map[string]string{}
		}
		t.binders[f[1]] = f[2]
	}
	return nil
}

// isWireLine reports whether a line starting with word belongs to parseWireLine.
func isWireLine(word string) bool {
	return word == "wire" || word == "local" || word == "wire-range" || word == "wire-binder"
}

func splitSentinel(s string) (dir, name string, err error) {
	i := strings.LastIndex(s, ".")
	if i < 0 || !dirRE.MatchString(s[:i]) || !identRE.MatchString(s[i+1:]) || !strings.HasPrefix(s[i+1:], "Err") {
		return "", "", fmt.Errorf("bad sentinel %q (want DIR.ErrName, DIR its package's directory)", s)
	}
	return s[:i], s[i+1:], nil
}

// Binder is the directory of the package whose init binds the sentinels of dir (itself, unless
// a wire-binder line names another).
func (t *Table) Binder(dir string) string {
	if b, ok := t.binders[dir]; ok {
		return b
	}
	return dir
}

// checkWire checks the wire and local lines: unique codes, constants and sentinels, each code
// in its binder's range, wire lines sorted by code and local lines by name (one line per
// sentinel keeps concurrent additions mergeable).
func (t *Table) checkWire() error {
	bad := func(line int, format string, args ...any) error {
		return fmt.Errorf("errors.tab:%d: %s", line, fmt.Sprintf(format, args...))
	}
	codes, consts, names := map[int]bool{}, map[string]bool{}, map[string]bool{}
	for i, w := range t.Wires {
		switch {
		case codes[w.Code]:
			return bad(w.Line, "wire code %d twice", w.Code)
		case consts[w.Const]:
			return bad(w.Line, "constant Code%s twice", w.Const)
		case names[w.Name()]:
			return bad(w.Line, "%s twice", w.Name())
		case i > 0 && t.Wires[i-1].Code > w.Code:
			return bad(w.Line, "wire lines go by code: %d after %d", w.Code, t.Wires[i-1].Code)
		}
		codes[w.Code], consts[w.Const], names[w.Name()] = true, true, true
		b := t.Binder(w.Dir)
		if !slices.ContainsFunc(t.WireRanges, func(r WireRange) bool { return r.Dir == b && r.First <= w.Code && w.Code <= r.Last }) {
			return bad(w.Line, "wire code %d is outside every wire-range of %s, which binds %s", w.Code, b, w.Name())
		}
	}
	for i, l := range t.Locals {
		if names[l.Name()] {
			return bad(l.Line, "%s has two wire or local lines", l.Name())
		}
		if i > 0 && t.Locals[i-1].Name() > l.Name() {
			return bad(l.Line, "local lines go by name: %s after %s", l.Name(), t.Locals[i-1].Name())
		}
		names[l.Name()] = true
	}
	return nil
}

// Sentinels is every sentinel of the wire and local lines, by name.
func (t *Table) Sentinels() []string {
	var out []string
	for _, w := range t.Wires {
		out = append(out, w.Name())
	}
	for _, l := range t.Locals {
		out = append(out, l.Name())
	}
	slices.Sort(out)
	return out
}

// Proto renders internal/proto/codes_gen.go: the Code* constants and the name of each code's
// sentinel.
func (t *Table) Proto() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "// %s\n\npackage proto\n\n", generated)
	b.WriteString("// The wire codes of the module's sentinels, from capi/errors.tab's wire lines: the package\n")
	b.WriteString("// that binds each (its wire_gen.go) follows the sentinel's name.\n")
	b.WriteString("const (\n")
	for _, w := range t.Wires {
		fmt.Fprintf(&b, "\tCode%s Code = %d // %s, bound by %s\n", w.Const, w.Code, w.Name(), t.Binder(w.Dir))
	}
	b.WriteString(")\n\n")
	b.WriteString("// wireNames names the sentinel of each code (the tests check that every code is bound).\n")
	b.WriteString("var wireNames = map[Code]string{\n")
	for _, w := range t.Wires {
		fmt.Fprintf(&b, "\tCode%s: %q,\n", w.Const, w.Name())
	}
	b.WriteString("}\n")
	return mustFormat(b.Bytes())
}

// Binds renders each binding package's wire_gen.go, by its directory: one proto.Bind of its
// wire lines in code order, which is their match order.
func (t *Table) Binds(module string) map[string][]byte {
	by := map[string][]Wire{}
	for _, w := range t.Wires {
		by[t.Binder(w.Dir)] = append(by[t.Binder(w.Dir)], w)
	}
	out := map[string][]byte{}
	for dir, ws := range by {
		var b bytes.Buffer
		fmt.Fprintf(&b, "// %s\n\npackage %s\n\n", generated, path.Base(dir))
		imports := []string{module + "/internal/proto"}
		for _, w := range ws {
			if w.Dir != dir && !slices.Contains(imports, module+"/"+w.Dir) {
				imports = append(imports, module+"/"+w.Dir)
			}
		}
		slices.Sort(imports)
		b.WriteString("import (\n")
		for _, p := range imports {
			fmt.Fprintf(&b, "\t%q\n", p)
		}
		b.WriteString(")\n\n")
		b.WriteString("// The wire codes of capi/errors.tab's wire lines this package binds, in code order: an error\n")
		b.WriteString("// that wraps several of these sentinels gets the code of the first (a later package's\n")
		b.WriteString("// bindings are tried before this one's).\n")
		b.WriteString("func init() {\n\tproto.Bind(\n")
		for _, w := range ws {
			val := w.Sentinel
			if w.Dir != dir {
				val = path.Base(w.Dir) + "." + w.Sentinel
			}
			fmt.Fprintf(&b, "\t\tproto.Pair{Code: proto.Code%s, Err: %s},\n", w.Const, val)
		}
		b.WriteString("\t)\n}\n")
		out[dir] = mustFormat(b.Bytes())
	}
	return out
}

// BindDirs is the directories Binds renders a file for, sorted.
func (t *Table) BindDirs() []string {
	var dirs []string
	for _, w := range t.Wires {
		if d := t.Binder(w.Dir); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	slices.SortFunc(dirs, cmp.Compare[string])
	return dirs
}

func mustFormat(src []byte) []byte {
	out, err := format.Source(src)
	if err != nil {
		panic(fmt.Sprintf("errtable: the generated Go does not parse: %v\n%s", err, src))
	}
	return out
}
