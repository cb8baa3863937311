package bench

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
)

// The C ABI contenders: a key get from a Python worker through the shmsteer package
// and from a C program, both through libshmsteer.so. They need the library built in the
// repository (`go generate ./capi`); bench still does not import the engine.

// ErrNoLibshmsteer reports that libshmsteer.so was not found.
var ErrNoLibshmsteer = errors.New("shmsteer: bench: libshmsteer.so not built: run `go generate ./capi` in the shmsteer repository (or set SHMSTEER_PYTHON_DIR to the directory holding shmsteer/libshmsteer.so)")

var (
	//go:embed python_keys_bench.py
	pythonKeysScript []byte
	//go:embed csrc/capi_keys_bench.c
	capiKeysSource []byte
)

func init() {
	at := slices.Index(figureNames, "keys.get.syncmanager_ns")
	figureNames = slices.Insert(figureNames, at, "keys.get.python_ns", "keys.get.python_ctypes_ns", "keys.get.capi_ns", "keys.get.capi_many_ns")
	baselines["keys.get.python_ns"] = "keys.get.syncmanager_ns"
	baselines["keys.get.python_ctypes_ns"] = "keys.get.python_ns"
	baselines["keys.get.capi_ns"] = "keys.get.shmsteer_ns"
	baselines["keys.get.capi_many_ns"] = "keys.get.shmsteer_ns"
}

// pythonDir finds the directory holding the shmsteer Python package with its built library:
// $SHMSTEER_PYTHON_DIR, else python/ in the working directory or one of its parents.
func pythonDir() (string, error) {
	if d := os.Getenv("SHMSTEER_PYTHON_DIR"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "shmsteer", "libshmsteer.so")); err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoLibshmsteer, err)
		}
		return d, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		cand := filepath.Join(dir, "python")
		if _, err := os.Stat(filepath.Join(cand, "shmsteer", "libshmsteer.so")); err == nil {
			return cand, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", ErrNoLibshmsteer
		}
		dir = parent
	}
}

// newPythonKeys is the Python worker process of keys.get.python_ns (op "get": the package's
// keys[id], through its _fastkeys extension when built) and keys.get.python_ctypes_ns (op
// "getctypes": the same gets through the package's ctypes path), alternating in one process.
func newPythonKeys() *shared {
	return &shared{start: func() (*proc, func() error, error) {
		dir, err := pythonDir()
		if err != nil {
			return nil, nil, err
		}
		return startScript("python_keys_bench.py", pythonKeysScript, "",
			strconv.Itoa(numKeys), strconv.Itoa(valueSize), dir)
	}}
}

// capiKeysSetup measures keys.get.capi_ns (op "get": one shmsteer_reader_key_get per key) or
// keys.get.capi_many_ns (op "getmany": shmsteer_reader_key_get_many over batches of 64 ids, a
// decode step's requests, timed per key): it compiles capi_keys_bench.c with gcc against the
// built library and header.
func capiKeysSetup(op string) setupFunc {
	return func() (Op, func() error, error) { return capiKeys(op) }
}

func capiKeys(op string) (Op, func() error, error) {
	dir, err := pythonDir()
	if err != nil {
		return nil, nil, err
	}
	lib := filepath.Join(dir, "shmsteer")
	if _, err := os.Stat(filepath.Join(lib, "shmsteer.h")); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrNoLibshmsteer, err)
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return nil, nil, fmt.Errorf("shmsteer: bench: gcc not found: %w", err)
	}
	tmp, err := os.MkdirTemp("", "shmsteer-bench-capi-")
	if err != nil {
		return nil, nil, err
	}
	src, bin := filepath.Join(tmp, "capi_keys_bench.c"), filepath.Join(tmp, "capi_keys_bench")
	if err := os.WriteFile(src, capiKeysSource, 0o600); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, nil, err
	}
	out, err := exec.Command(gcc, "-O2", "-I", lib, src, "-L", lib, "-lshmsteer", "-Wl,-rpath,"+lib, "-o", bin).CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, nil, fmt.Errorf("shmsteer: bench: compiling capi_keys_bench.c: %v: %s", err, out)
	}
	p, err := startProc("capi_keys_bench", exec.Command(bin, "owner", strconv.Itoa(numKeys), strconv.Itoa(valueSize)), childTimeout)
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, nil, err
	}
	return p.Op(op), func() error { return errors.Join(p.Close(), os.RemoveAll(tmp)) }, nil
}
