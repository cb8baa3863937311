package errtable

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// Python renders the Python exception classes, by file name in python/shmsteer/.
// _errors_base.py holds ShmsteerError and the hand-written group bases (pyGroups);
// _errors_<package>.py holds the classes of one Go package's sentinels, importing the bases
// they derive from; errors.py, the module callers import, re-exports every class and adds
// BY_CODE and error_for. One file per package keeps each file short (the charter's 800 lines:
// the table's 115 classes made errors.py 1,146). Packages whose classes derive from each other
// in a loop would make their files import each other: that is an error.
func (t *Table) Python() (map[string][]byte, error) {
	order := t.pyOrder()
	var pkgs []string
	byPkg := map[string][]Row{}
	home := map[string]string{} // class -> package
	for _, r := range order {
		if _, ok := byPkg[r.Pkg]; !ok {
			pkgs = append(pkgs, r.Pkg)
		}
		byPkg[r.Pkg] = append(byPkg[r.Pkg], r)
		home[r.PyClass] = r.Pkg
	}
	slices.SortStableFunc(pkgs, func(a, b string) int { return t.pkgIndex(a) - t.pkgIndex(b) })
	out := map[string][]byte{"_errors_base.py": []byte(pyBase)}
	imports := map[string][]string{} // package -> the packages its file imports
	for _, pkg := range pkgs {
		src, deps := pyPackageFile(pkg, byPkg[pkg], home)
		out[pyPartFile(pkg)] = src
		imports[pkg] = deps
	}
	if loop := pyImportLoop(pkgs, imports); loop != nil {
		return nil, fmt.Errorf("errors.tab: the Python classes of packages %s derive from each other in a loop",
			strings.Join(loop, " -> "))
	}
	out["errors.py"] = t.pyIndex(pkgs, byPkg)
	return out, nil
}

// pkgIndex is the position of package name's first package line.
func (t *Table) pkgIndex(name string) int {
	return slices.IndexFunc(t.Packages, func(p Package) bool { return p.Name == name })
}

// pyOrder is the rows by code, each after the row of its table base.
func (t *Table) pyOrder() []Row {
	done := map[string]bool{}
	rows := t.byCode()
	var order []Row
	for len(order) < len(rows) {
		for _, r := range rows {
			if done[r.PyClass] {
				continue
			}
			if p, ok := t.parentRow(r); ok && !done[p.PyClass] {
				continue
			}
			done[r.PyClass] = true
			order = append(order, r)
		}
	}
	return order
}

// pyPartFile is the file of package pkg's classes.
func pyPartFile(pkg string) string { return "_errors_" + pkg + ".py" }

// pyClassBases is r's bases as its class line names them: ShmsteerError first unless a table or
// group class is.
func pyClassBases(r Row) []string {
	if len(r.PyBases) == 0 || pyBuiltins[r.PyBases[0]] {
		return append([]string{"ShmsteerError"}, r.PyBases...)
	}
	return r.PyBases
}

// pyPackageFile renders _errors_<pkg>.py (rows in pyOrder) and returns the other packages it
// imports classes from; home is each table class's package.
func pyPackageFile(pkg string, rows []Row, home map[string]string) ([]byte, []string) {
	from := map[string][]string{} // module -> names
	var deps []string
	for _, r := range rows {
		for _, base := range pyClassBases(r) {
			mod := ""
			switch {
			case pyBuiltins[base]:
			case base == "ShmsteerError" || pyGroups[base]:
				mod = "_errors_base"
			case home[base] != pkg:
				mod = strings.TrimSuffix(pyPartFile(home[base]), ".py")
				if !slices.Contains(deps, home[base]) {
					deps = append(deps, home[base])
				}
			}
			if mod != "" && !slices.Contains(from[mod], base) {
				from[mod] = append(from[mod], base)
			}
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s\n\"\"\"The exception classes of Go package %s's sentinels: import them from\n", generated, pkg)
	b.WriteString(":mod:`shmsteer.errors`, which documents them.\"\"\"\n\nfrom __future__ import annotations\n\n")
	mods := make([]string, 0, len(from))
	for m := range from {
		mods = append(mods, m)
	}
	slices.Sort(mods)
	for _, m := range mods {
		names := from[m]
		slices.Sort(names)
		fmt.Fprintf(&b, "from .%s import %s\n", m, strings.Join(names, ", "))
	}
	for _, r := range rows {
		pyClass(&b, r)
	}
	b.WriteString("\n\n__all__ = [\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "    %q,\n", r.PyClass)
	}
	b.WriteString("]\n")
	return b.Bytes(), deps
}

// pyClass renders r's class.
func pyClass(b *bytes.Buffer, r Row) {
	doc := fmt.Sprintf("Mirrors Go's %s (code %d, SHMSTEER_E_%s).", r.GoName(), r.Code, r.Name)
	if r.Doc != "" {
		doc = fmt.Sprintf("Mirrors Go's %s (code %d, SHMSTEER_E_%s): %s.", r.GoName(), r.Code, r.Name, r.Doc)
	}
	fmt.Fprintf(b, "\n\nclass %s(%s):\n    %s\n\n    code = %d\n    go_name = %q\n",
		r.PyClass, strings.Join(pyClassBases(r), ", "), pyDocstring(doc), r.Code, r.GoName())
}

// pyImportLoop is a loop of packages whose files import each other (nil: none).
func pyImportLoop(pkgs []string, imports map[string][]string) []string {
	state := map[string]int{} // 1: on the path, 2: done
	var path []string
	var visit func(p string) []string
	visit = func(p string) []string {
		switch state[p] {
		case 1:
			return append(slices.Clone(path[slices.Index(path, p):]), p)
		case 2:
			return nil
		}
		state[p] = 1
		path = append(path, p)
		for _, d := range imports[p] {
			if loop := visit(d); loop != nil {
				return loop
			}
		}
		path = path[:len(path)-1]
		state[p] = 2
		return nil
	}
	for _, p := range pkgs {
		if loop := visit(p); loop != nil {
			return loop
		}
	}
	return nil
}

// pyIndex renders errors.py: the module doc, every class re-exported from its part, BY_CODE,
// __all__ and error_for.
func (t *Table) pyIndex(pkgs []string, byPkg map[string][]Row) []byte {
	var b bytes.Buffer
	b.WriteString(pyHead)
	b.WriteString("from ._errors_base import ShmsteerError, VectorFileError\n")
	for _, pkg := range pkgs {
		fmt.Fprintf(&b, "from .%s import (\n", strings.TrimSuffix(pyPartFile(pkg), ".py"))
		for _, r := range byPkg[pkg] {
			fmt.Fprintf(&b, "    %s,\n", r.PyClass)
		}
		b.WriteString(")\n")
	}
	rows := t.byCode()
	b.WriteString("\n# Every class by its code.\nBY_CODE: Dict[int, Type[ShmsteerError]] = {\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "    %d: %s,\n", r.Code, r.PyClass)
	}
	b.WriteString("}\n\n__all__ = [\n    \"ShmsteerError\",\n    \"VectorFileError\",\n    \"BY_CODE\",\n    \"error_for\",\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "    %q,\n", r.PyClass)
	}
	b.WriteString("]\n")
	b.WriteString(pyTail)
	return b.Bytes()
}

// pyDocstring wraps a one-paragraph docstring at 100 columns (4 spaces of indent).
func pyDocstring(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	words := strings.Fields(s)
	var lines []string
	line := `"""`
	for _, w := range words {
		if len(line)+1+len(w) > 96 && line != `"""` {
			lines = append(lines, line)
			line = w
			continue
		}
		if line == `"""` {
			line += w
		} else {
			line += " " + w
		}
	}
	if len(lines) == 0 {
		return line + `"""`
	}
	lines = append(lines, line+`"""`)
	return strings.Join(lines, "\n    ")
}

const pyHead = `# ` + generated + `
"""Exceptions mirroring the Go sentinel errors of shmsteer.

Every error code of ` + "``shmsteer.h``" + ` has one class here, named after its Go sentinel
(` + "``ipc.ErrOwnerGone``" + ` -> :class:` + "`OwnerGoneError`" + `). All derive from :class:` + "`ShmsteerError`" + `;
several also derive from the built-in exception a Python caller would expect (a missing key is
a :class:` + "`KeyError`" + `, a bad argument a :class:` + "`ValueError`" + `, a dead owner a
:class:` + "`ConnectionError`" + `). Sentinels that match one another with ` + "``errors.Is``" + ` in Go are
subclasses here: :class:` + "`IncompatibleError`" + ` (ipc) is a :class:` + "`LayoutIncompatibleError`" + ` (shm), and
:class:` + "`MarkedError`" + ` a :class:` + "`NotFoundError`" + `.

The classes are defined in this module's parts, one per Go package (` + "``_errors_<package>.py``" + `,
and ` + "``_errors_base.py``" + ` for the bases); import them from here, where they are this module's
own. This module and its parts are generated from capi/errors.tab (` + "``go generate ./capi``" + `): add
a code there.
"""

from __future__ import annotations

from typing import Dict, Type

`

const pyBase = `# ` + generated + `
"""The base classes of :mod:` + "`shmsteer.errors`" + `: import them from there."""

from __future__ import annotations


class ShmsteerError(Exception):
    """Base of every shmsteer error.

    Attributes:
        code: the ` + "``SHMSTEER_E_*``" + ` code of ` + "``shmsteer.h``" + `.
        go_name: the Go sentinel it mirrors, e.g. ` + "``\"ipc.ErrOwnerGone\"``" + `.
    """

    code: int = 0
    go_name: str = ""

    def __str__(self) -> str:  # KeyError would otherwise repr() its message
        return str(self.args[0]) if self.args else self.go_name


class VectorFileError(ShmsteerError, ValueError):
    """Base of the errors of package steer/vecfile (codes 80..99): a vector file that cannot be
    imported or exported. A ` + "``ValueError``" + `; the message names the file, the tensor and the
    expected shape. (A file whose tensor does not fit the model raises steer's class instead,
    e.g. :class:` + "`HiddenSizeError`" + `, as the C ABI reports steer's code first.)"""


__all__ = ["ShmsteerError", "VectorFileError"]
`

const pyTail = `
# The classes are defined in the parts: they are this module's own (their repr, pickling and
# the docs name shmsteer.errors).
for _cls in (ShmsteerError, VectorFileError, *BY_CODE.values()):
    _cls.__module__ = __name__
del _cls


def error_for(code: int, message: str) -> ShmsteerError:
    """The exception for a ` + "``SHMSTEER_E_*``" + ` code, carrying the library's message."""
    cls = BY_CODE.get(code, ShmsteerError)
    err = cls(message or cls.go_name or f"shmsteer error {code}")
    if cls is ShmsteerError:
        err.code = code
    return err
`
