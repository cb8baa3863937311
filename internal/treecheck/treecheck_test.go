package treecheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const (
	maxFileLines = 800
	maxFuncLines = 100
)

// allowList lists today's offenders, one a line, keyed as the test reports them: "path" for a
// file, "path:Func" or "path:Recv.Method" for a Go function, "path:Class.method" for a Python
// one (paths relative to the repository root, slash-separated). Each entry must still be over
// its limit: remove it when its owner splits it.
var allowList = []string{}

// TestSizes checks every .go, .py, .c and .h file under the repository root against
// maxFileLines and every Go and Python function against maxFuncLines (C functions are not
// checked).
func TestSizes(t *testing.T) {
	root := repoRoot(t)
	goFiles, pyFiles, cFiles := sourceFiles(t, root)
	over := map[string]int{}
	for _, rel := range slices.Concat(goFiles, pyFiles, cFiles) {
		n := countLines(t, filepath.Join(root, rel))
		if n > maxFileLines {
			over[rel] = n
		}
	}
	for _, rel := range goFiles {
		goFuncsOver(t, root, rel, over)
	}
	pythonChecked := pyFuncsOver(t, root, pyFiles, over)
	allowed := map[string]bool{}
	for _, key := range allowList {
		if allowed[key] {
			t.Errorf("%s: listed twice in allowList", key)
		}
		allowed[key] = true
	}
	for _, key := range sortedKeys(over) {
		if !allowed[key] {
			t.Errorf("%s: %d lines, over the limit (files %d, functions %d): split it",
				key, over[key], maxFileLines, maxFuncLines)
		}
	}
	for _, key := range sortedKeys(allowed) {
		if _, ok := over[key]; ok {
			continue
		}
		if !pythonChecked && strings.Contains(key, ".py") {
			continue
		}
		t.Errorf("%s: allow-listed but no longer over the limit (or gone): remove it from allowList", key)
	}
}

// repoRoot walks up from the test's directory to the directory holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// sourceFiles lists the .go, .py and C (.c and .h) files under root, relative and
// slash-separated, skipping the directories skipDir names.
func sourceFiles(t *testing.T, root string) (goFiles, pyFiles, cFiles []string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && skipDir(name) {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		switch filepath.Ext(name) {
		case ".go":
			goFiles = append(goFiles, filepath.ToSlash(rel))
		case ".py":
			pyFiles = append(pyFiles, filepath.ToSlash(rel))
		case ".c", ".h":
			cFiles = append(cFiles, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(goFiles) == 0 {
		t.Fatalf("no .go files under %s", root)
	}
	if len(cFiles) == 0 {
		t.Fatalf("no .c or .h files under %s", root)
	}
	return goFiles, pyFiles, cFiles
}

// skipDir reports directories that hold no source of the project's own: hidden ones (.git,
// virtual environments, caches), Python's caches and setuptools' build outputs.
func skipDir(name string) bool {
	return strings.HasPrefix(name, ".") || name == "__pycache__" || name == "node_modules" ||
		name == "build" || name == "dist" || strings.HasSuffix(name, ".egg-info")
}

// countLines counts lines as wc -l does, plus a last line without its newline.
func countLines(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := bytes.Count(data, []byte("\n"))
	if len(data) > 0 && data[len(data)-1] != '\n' {
		n++
	}
	return n
}

// goFuncsOver records each func declaration in rel longer than maxFuncLines.
func goFuncsOver(t *testing.T, root, rel string, over map[string]int) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.SkipObjectResolution)
	if err != nil {
		t.Errorf("%s: %v", rel, err)
		return
	}
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
		if n > maxFuncLines {
			key := rel + ":" + goFuncName(fd)
			over[key] = max(over[key], n)
		}
	}
}

// goFuncName is Func for a function and Recv.Method for a method.
func goFuncName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
}

// pyFuncsScript reads file paths, one a line, and prints "path<TAB>qualname<TAB>lines" for each
// def longer than the limit given as argv[1]; nested defs are named outer.inner.
const pyFuncsScript = `
import ast, sys
limit = int(sys.argv[1])
def walk(path, node, prefix):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                n = child.end_lineno - child.lineno + 1
                if n > limit:
                    print(f"{path}\t{name}\t{n}")
            walk(path, child, name + ".")
        else:
            walk(path, child, prefix)
for line in sys.stdin:
    path = line.rstrip("\n")
    with open(path, encoding="utf-8") as f:
        walk(path, ast.parse(f.read(), filename=path), "")
`

// pyFuncsOver records each Python def longer than maxFuncLines; it reports false, and skips,
// when python3 is not on PATH.
func pyFuncsOver(t *testing.T, root string, pyFiles []string, over map[string]int) bool {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Log("skipping the Python function check: no python3 on PATH (python files are still size-checked)")
		return false
	}
	cmd := exec.Command(python, "-c", pyFuncsScript, strconv.Itoa(maxFuncLines))
	cmd.Dir = root
	cmd.Stdin = strings.NewReader(strings.Join(pyFiles, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 ast walk: %v\n%s", err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, name, lines, err := splitPyLine(sc.Text())
		if err != nil {
			t.Fatal(err)
		}
		key := path + ":" + name
		over[key] = max(over[key], lines)
	}
	return true
}

func splitPyLine(line string) (path, name string, lines int, err error) {
	parts := strings.Split(line, "\t")
	if len(parts) != 3 {
		return "", "", 0, errors.New("python3 ast walk: bad line " + strconv.Quote(line))
	}
	lines, err = strconv.Atoi(parts[2])
	if err != nil {
		return "", "", 0, fmt.Errorf("python3 ast walk: bad line %q: %w", line, err)
	}
	return parts[0], parts[1], lines, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
