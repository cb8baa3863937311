//go:build cgo

package main

import (
	"archive/zip"
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// roleEnv selects a role when the test binary is re-executed as a child process (by this test
// or by the Python tests, which find the binary in SHMSTEER_GO_OWNER_BIN).
const roleEnv = "SHMSTEER_CAPI_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "owner":
		os.Exit(runOwnerRole())
	case "capture":
		os.Exit(runCaptureRole())
	case "keywriter":
		os.Exit(runKeyWriterRole())
	}
	os.Exit(m.Run())
}

// The fixture every Go owner serves (the C example and the Python tests check it).
var (
	fixtureModel = steer.ModelConfig{Hidden: 64, Layers: 4}
	fixtureKey   = func() []byte {
		b := make([]byte, 32)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}()
)

func fixtureVector() []float32 {
	v := make([]float32, fixtureModel.Hidden)
	for i := range v {
		v[i] = float32(i) * 0.25
	}
	return v
}

// startGoOwner starts an owner and steering engine and writes the fixture: key "req-1",
// "req-1-revoked" revoked, named vector "v1" (post_block, layer 1, scale 1, data i*0.25).
func startGoOwner(secret, ns string) (*ipc.Owner, *steer.Owner, error) {
	rc, err := steer.RegionConfig(fixtureModel, shm.Config{IndexSlots: 1 << 12, ArenaBytes: 16 << 20})
	if err != nil {
		return nil, nil, err
	}
	s := ipc.NewSecret([]byte(secret))
	o, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &s, Namespace: ns, Region: rc})
	if err != nil {
		return nil, nil, err
	}
	eng, err := steer.Open(o.Region(), &fixtureModel, steer.Options{Clients: o.Clients})
	if err != nil {
		o.Close()
		return nil, nil, err
	}
	eng.Serve(func(op uint16, h func([]byte) ([]byte, error)) { o.Handle(op, h) })
	reg, err := keys.Open(o, keys.Options{})
	if err == nil {
		err = reg.Set("req-1", fixtureKey)
	}
	if err == nil {
		err = reg.Set("req-1-revoked", []byte("gone"))
	}
	if err == nil {
		err = reg.Remove("req-1-revoked")
	}
	if err == nil {
		_, err = eng.Register("v1", []steer.Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: fixtureVector()}})
	}
	if err != nil {
		o.Close()
		return nil, nil, err
	}
	return o, eng, nil
}

// runOwnerRole serves the fixture until stdin closes (the parent died or is done).
func runOwnerRole() int {
	o, _, err := startGoOwner(os.Getenv("SHMSTEER_SECRET"), os.Getenv("SHMSTEER_TEST_NS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "owner:", err)
		return 1
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	o.Close()
	return 0
}

var (
	buildOnce sync.Once
	buildErr  error
	libDir    string
)

// buildLibrary runs what `go generate ./capi` runs: the c-shared build into python/shmsteer/.
func buildLibrary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := filepath.Abs(filepath.Join("..", "python", "shmsteer"))
		if err != nil {
			buildErr = err
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("the go command is needed to build libshmsteer.so: %v", err)
			return
		}
		cmd := exec.Command(goBin, "generate", ".")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go generate ./capi: %v\n%s", err, out)
			return
		}
		libDir = dir
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return libDir
}

// The library exports exactly the functions shmsteer.h (with the headers it includes) declares:
// the Go functions behind them stay internal, so no caller can bypass the fork check.
func TestExportsMatchHeader(t *testing.T) {
	lib := buildLibrary(t)
	var declared []string
	for _, name := range headerFiles(t) {
		hdr, err := os.ReadFile(name)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`(?m)^[a-z].*?\b(shmsteer_[a-z0-9_]+)\(`).FindAllSubmatch(hdr, -1) {
			declared = append(declared, string(m[1]))
		}
	}
	require.Contains(t, declared, "shmsteer_capture_attach", "the capture part is read")
	f, err := elf.Open(filepath.Join(lib, "libshmsteer.so"))
	require.NoError(t, err)
	defer f.Close()
	syms, err := f.DynamicSymbols()
	require.NoError(t, err)
	var exported []string
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			exported = append(exported, s.Name)
		}
	}
	sort.Strings(declared)
	sort.Strings(exported)
	require.Equal(t, declared, exported)
	_, err = os.Stat(filepath.Join(lib, "libshmsteer.h"))
	require.True(t, os.IsNotExist(err), "cgo's header declaring internal functions is removed")
}

// headerFiles returns the C ABI's headers: shmsteer.h and the headers of this directory it
// includes (its generated error codes, its capture part), the files go generate copies into
// the Python package.
func headerFiles(t *testing.T) []string {
	t.Helper()
	hdr, err := os.ReadFile("shmsteer.h")
	require.NoError(t, err)
	files := []string{"shmsteer.h"}
	for _, m := range regexp.MustCompile(`(?m)^#include "([^"]+)"`).FindAllSubmatch(hdr, -1) {
		files = append(files, string(m[1]))
	}
	require.Contains(t, files, "shmsteer_errors.h")
	return files
}

func TestHandleTable(t *testing.T) {
	h := handles.put("a")
	require.NotZero(t, h)
	v, ok := getAs[string](h)
	require.True(t, ok)
	require.Equal(t, "a", v)
	_, ok = getAs[int](h)
	require.False(t, ok, "wrong type")
	require.True(t, handles.remove(h))
	require.False(t, handles.remove(h), "twice")
	h2 := handles.put("b")
	require.Nil(t, handles.get(h), "a stale handle finds nothing, even when its slot is reused")
	require.Equal(t, "b", handles.get(h2))
	require.True(t, handles.remove(h2))
	require.Nil(t, handles.get(0))
	require.Nil(t, handles.get(1<<40|maxHandles+5))
}

func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not found: %v", name, err)
	}
	return p
}

// The C example, compiled with gcc against libshmsteer.so, attaches to a Go owner and reads
// keys and vectors; a child it forks gets SHMSTEER_E_FORKED.
func TestCExample(t *testing.T) {
	gcc := requireTool(t, "gcc")
	lib := buildLibrary(t)
	bin := filepath.Join(t.TempDir(), "example")
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-I", ".", filepath.Join("example", "example.c"),
		"-L", lib, "-lshmsteer", "-Wl,-rpath,"+lib, "-o", bin).CombinedOutput()
	require.NoError(t, err, "%s", out)

	if gxx, err := exec.LookPath("g++"); err == nil { // the header is valid C++ too
		hdr := filepath.Join(t.TempDir(), "h.cpp")
		require.NoError(t, os.WriteFile(hdr, []byte("#include \"shmsteer.h\"\n"), 0o600))
		out, err := exec.Command(gxx, "-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only", "-I", ".", hdr).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}

	ns := fmt.Sprintf("capi-c-%d-%d", os.Getpid(), time.Now().UnixNano())
	o, _, err := startGoOwner("c-example-secret", ns)
	require.NoError(t, err)
	defer o.Close()

	cmd := exec.Command(bin, ns, "req-1", "v1")
	cmd.Env = append(os.Environ(), "SHMSTEER_SECRET=c-example-secret")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	got := string(out)
	t.Log(got)
	require.Contains(t, got, "key req-1 len=32 hex=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n")
	require.Contains(t, got, "small buffer: capi.ErrBufferTooSmall need=32\n")
	require.Contains(t, got, "missing: keys.ErrNotFound\n")
	require.Contains(t, got, "message: shmsteer: key not found for request id\n")
	require.Contains(t, got, "message after a success: \"\"\n")
	require.Contains(t, got, "revoked: keys.ErrRevoked\n")
	require.Contains(t, got, "many 0: ok len=32 first=1f\n")
	require.Contains(t, got, "many 1: keys.ErrNotFound len=0 first=00\n")
	require.Contains(t, got, "many 2: keys.ErrRevoked len=0 first=00\n")
	require.Contains(t, got, "many 3: capi.ErrBufferTooSmall len=32 first=00\n")
	var sum float64
	for _, f := range fixtureVector() {
		sum += float64(f)
	}
	require.Contains(t, got, fmt.Sprintf("entry 0 hook=2 layer=1 scale=1 len=64 sum=%.4f first=0.0000\n", sum))
	require.Contains(t, got, "file round trip: digest equal\n")
	require.Contains(t, got, "model hint: llama\n")
	require.Contains(t, got, "scale 0: vecfile.ErrBadOptions\n")
	require.Contains(t, got, "export unknown: steer.ErrUnknownVector\n")
	require.Contains(t, got, "forked child: SHMSTEER_E_FORKED\n")
	require.Contains(t, got, "closed twice: capi.ErrBadHandle\n")
	// A reader left open is freed with its handle (before, it stayed in the handle table and
	// answered CLOSED until shmsteer_reader_close).
	require.Contains(t, got, "reader after close: capi.ErrBadHandle\n")
	require.Contains(t, got, "reader tls after close: capi.ErrBadHandle\n")
	require.Contains(t, got, "reader many after close: capi.ErrBadHandle\n")
	require.Contains(t, got, "old reader beside a new one: capi.ErrBadHandle\n")
	require.Contains(t, got, "new reader: len=32\n")
	require.Contains(t, got, "reader close after its handle closed: capi.ErrBadHandle\n")

	// A wrong secret is refused.
	cmd = exec.Command(bin, ns, "req-1", "v1")
	cmd.Env = append(os.Environ(), "SHMSTEER_SECRET=wrong")
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "attach: ipc.ErrAuthFailed")
}

// TestPython runs the Python package's pytest suite (python/tests) against the library built
// here, with this test binary as the Go owner the Python tests start (roleEnv). The interpreter
// is $SHMSTEER_PYTHON: the project's virtual environment with the pinned torch 2.x, numpy and
// pytest, which `bash .ci/pyenv` makes and prints. Without it the test skips and says so; CI
// sets it (.ci/run), and the suite must not skip there.
func TestPython(t *testing.T) {
	py := pythonForTests(t)
	buildLibrary(t)
	self, err := filepath.Abs(os.Args[0])
	require.NoError(t, err)
	pyDir, err := filepath.Abs(filepath.Join("..", "python"))
	require.NoError(t, err)
	// -rs lists every skip with its reason; -v (with go test -v) names each test, -q otherwise
	// (the two together cancel out).
	args := []string{"-m", "pytest", "-rs", "-p", "no:cacheprovider"}
	// SHMSTEER_PYTEST_FILES (space-separated files of python/tests) runs those alone: .ci/run
	// repeats the multi-process files without the whole suite.
	if files := strings.Fields(os.Getenv("SHMSTEER_PYTEST_FILES")); len(files) > 0 {
		for _, f := range files {
			args = append(args, filepath.Join(pyDir, "tests", f))
		}
	} else {
		args = append(args, filepath.Join(pyDir, "tests"))
	}
	if testing.Verbose() {
		args = append(args, "-v")
	} else {
		args = append(args, "-q")
	}
	// The follower tests restart a real `shmsteer serve`.
	serveBin := filepath.Join(t.TempDir(), "shmsteer")
	if out, err := exec.Command("go", "build", "-o", serveBin, "../cmd/shmsteer").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/shmsteer: %v\n%s", err, out)
	}
	cmd := exec.Command(py, args...)
	cmd.Dir = pyDir
	cmd.Env = append(os.Environ(), "SHMSTEER_GO_OWNER_BIN="+self, "SHMSTEER_SERVE_BIN="+serveBin, "PYTHONPATH="+pyDir, "PYTHONDONTWRITEBYTECODE=1")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	var log strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
	}
	err = cmd.Wait()
	t.Log(log.String())
	require.NoError(t, err, "pytest failed")
}

// TestPythonVenvInstall runs the README's install lines: a virtual environment over Debian's
// interpreter that sees its packages, the package installed into it with pip and no package
// index, imported from outside the checkout with its library.
func TestPythonVenvInstall(t *testing.T) {
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import venv, setuptools, wheel, pip").CombinedOutput(); err != nil {
		t.Skipf("venv, pip, setuptools or wheel missing for %s (apt-get install python3-venv python3-pip python3-setuptools python3-wheel): %s", py, out)
	}
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	lines := []string{"go generate ./capi", py + " -m venv --system-site-packages .venv",
		".venv/bin/python -m pip install --no-index --no-build-isolation ./python",
		".venv/bin/python -c 'import shmsteer; print(shmsteer.__version__)'"}
	for _, l := range lines {
		require.Contains(t, string(readme), "\n    "+l, "the README's install lines changed: change this test with them")
	}
	buildLibrary(t) // the first line
	// The checkout's python/ copied (pip builds in the source tree: build/, *.egg-info).
	dir := t.TempDir()
	src := filepath.Join(dir, "python")
	require.NoError(t, os.MkdirAll(src, 0o755))
	for _, p := range []string{"pyproject.toml", "setup.py", "README.md", "shmsteer"} {
		out, err := exec.Command("cp", "-r", filepath.Join("..", "python", p), filepath.Join(src, p)).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	for _, l := range lines[1:] {
		cmd := exec.Command("bash", "-c", l)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s\n%s", l, out)
	}
	cmd := exec.Command(filepath.Join(dir, ".venv", "bin", "python"), "-c",
		"import os, shmsteer, numpy; d = os.path.dirname(shmsteer.__file__); print(d); print(os.path.exists(os.path.join(d, 'libshmsteer.so'))); print(shmsteer.keys.FAST_KEYS); print(os.path.exists(os.path.join(d, '_faststep.abi3.so')))")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	got := strings.Fields(string(out))
	require.Len(t, got, 4, "%s", out)
	require.True(t, strings.HasPrefix(got[0], filepath.Join(dir, ".venv")), "imported from the venv: %s", got[0])
	require.Equal(t, "True", got[1], "the library is installed with the package")
	// The key get extension, where go generate built it (python3-dev installed), is installed
	// with the package and in use.
	_, err = os.Stat(filepath.Join("..", "python", "shmsteer", "_fastkeys.abi3.so"))
	require.Equal(t, map[bool]string{true: "True", false: "False"}[err == nil], got[2], "shmsteer.keys.FAST_KEYS in the venv")
	_, err = os.Stat(filepath.Join("..", "python", "shmsteer", "_faststep.abi3.so"))
	require.Equal(t, map[bool]string{true: "True", false: "False"}[err == nil], got[3], "the resolve extension installed in the venv")
}

// The Python package builds, with Debian's setuptools and wheel and no package index, into a
// wheel tagged for this platform (it carries libshmsteer.so) whose version is the package's
// one version string, and ships the library, its headers and py.typed.
func TestPythonWheel(t *testing.T) {
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import setuptools, wheel, pip").CombinedOutput(); err != nil {
		t.Skipf("pip, setuptools or wheel missing for %s (apt-get install python3-pip python3-setuptools python3-wheel): %s", py, out)
	}
	buildLibrary(t)
	// Build from a copy: pip builds in the source tree (build/, *.egg-info).
	src := filepath.Join(t.TempDir(), "python")
	require.NoError(t, os.MkdirAll(src, 0o755))
	for _, p := range []string{"pyproject.toml", "setup.py", "README.md", "shmsteer"} {
		out, err := exec.Command("cp", "-r", filepath.Join("..", "python", p), filepath.Join(src, p)).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	dist := t.TempDir()
	out, err := exec.Command(py, "-m", "pip", "wheel", "-q", "--no-index", "--no-build-isolation", "--no-deps", "-w", dist, src).CombinedOutput()
	require.NoError(t, err, "%s", out)
	ver, err := os.ReadFile(filepath.Join("..", "python", "shmsteer", "_version.py"))
	require.NoError(t, err)
	m := regexp.MustCompile(`__version__ = "([^"]+)"`).FindSubmatch(ver)
	require.NotNil(t, m, "_version.py holds the version")
	wheels, err := filepath.Glob(filepath.Join(dist, "*.whl"))
	require.NoError(t, err)
	require.Len(t, wheels, 1)
	require.Regexp(t, `^shmsteer-`+regexp.QuoteMeta(string(m[1]))+`-py3-none-linux_[a-z0-9_]+\.whl$`, filepath.Base(wheels[0]))
	z, err := zip.OpenReader(wheels[0])
	require.NoError(t, err)
	defer z.Close()
	var names []string
	for _, f := range z.File {
		names = append(names, f.Name)
	}
	want := []string{"shmsteer/libshmsteer.so", "shmsteer/py.typed", "shmsteer/errors.py", "shmsteer/_errors_base.py", "shmsteer/_errors_steer.py"}
	for _, h := range headerFiles(t) {
		want = append(want, "shmsteer/"+h)
	}
	for _, ext := range []string{"_fastkeys.abi3.so", "_faststep.abi3.so"} {
		if _, err := os.Stat(filepath.Join("..", "python", "shmsteer", ext)); err == nil {
			want = append(want, "shmsteer/"+ext) // built by go generate with python3-dev
		}
	}
	for _, w := range want {
		require.Contains(t, names, w)
	}
}

// pythonForTests returns $SHMSTEER_PYTHON after checking that it imports the packages the
// Python suite needs; the test skips with the reason (and the command that fixes it) otherwise.
func pythonForTests(t *testing.T) string {
	t.Helper()
	py := os.Getenv("SHMSTEER_PYTHON")
	if py == "" {
		t.Skip("SHMSTEER_PYTHON not set: export SHMSTEER_PYTHON=$(bash .ci/pyenv) (a virtual environment with the pinned torch, numpy and pytest)")
	}
	// Named but broken is a failure, not a skip: whoever set it asked for the suite.
	if out, err := exec.Command(py, "-c", "import pytest, numpy, torch").CombinedOutput(); err != nil {
		t.Fatalf("SHMSTEER_PYTHON=%s lacks pytest, numpy or torch (rerun bash .ci/pyenv): %s", py, out)
	}
	return py
}
