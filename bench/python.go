package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNoPython reports that no Python interpreter could run the script.
var ErrNoPython = errors.New("shmsteer: bench: no usable python3")

// ErrNoNumpy reports that no probed interpreter can import numpy.
var ErrNoNumpy = errors.New("shmsteer: bench: numpy not importable")

// The scripts are embedded so `shmsteer bench` works from any directory and
// from an installed binary; they are written to a temp dir at run time.
var (
	//go:embed syncmanager_bench.py
	syncManagerScript []byte
	//go:embed numpy_bench.py
	numpyScript []byte
)

// interpreters are probed in this order. A Debian python3-numpy lands in
// /usr/bin/python3's dist-packages, not in a pyenv python3 that shadows it
// on PATH, so both are tried.
var interpreters = []string{"python3", "/usr/bin/python3"}

// findPython returns the first interpreter that runs `import <module>`
// (module "" just checks that it runs), or why none did.
func findPython(module string) (string, error) {
	code := "pass"
	if module != "" {
		code = "import " + module
	}
	var reasons []string
	for _, py := range interpreters {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := exec.CommandContext(ctx, py, "-c", code).CombinedOutput()
		cancel()
		if err == nil {
			return py, nil
		}
		msg := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:] // the exception line of a traceback
		}
		if msg == "" {
			msg = err.Error()
		}
		reasons = append(reasons, py+": "+msg)
	}
	sentinel := ErrNoPython
	if module == "numpy" {
		sentinel = ErrNoNumpy
	}
	return "", fmt.Errorf("%w (%s)", sentinel, strings.Join(reasons, "; "))
}

// startScript writes script to a fresh temp dir and starts it under the
// first interpreter that can import module. The temp dir goes with Close.
func startScript(name string, script []byte, module string, args ...string) (*proc, func() error, error) {
	py, err := findPython(module)
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "shmsteer-bench-")
	if err != nil {
		return nil, nil, err
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, script, 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	// -u: unbuffered stdio, the protocol is line by line. The spawned
	// workers re-import the script by path, so it must stay on disk until
	// the process is closed.
	cmd := exec.Command(py, append([]string{"-u", path}, args...)...)
	p, err := startProc(name, cmd, childTimeout)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	closeAll := func() error {
		return errors.Join(p.Close(), os.RemoveAll(dir))
	}
	return p, closeAll, nil
}

// shared starts a resource on first use and closes it when the last user
// releases it, so contenders measured alternately (get and set of one
// SyncManager, or the four numpy sizes) share one process.
type shared struct {
	start func() (*proc, func() error, error)

	mu    sync.Mutex
	refs  int
	p     *proc
	close func() error
	err   error
	info  string // the last process's ready-line info (proc.Info), kept after it closes
}

func (s *shared) acquire() (*proc, func() error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil && s.err == nil {
		s.p, s.close, s.err = s.start()
		if s.err == nil {
			s.info = s.p.Info
		}
	}
	if s.err != nil {
		// Remember the failure: a second contender must not pay for (or
		// report differently about) the same missing interpreter.
		return nil, nil, s.err
	}
	s.refs++
	return s.p, s.release, nil
}

func (s *shared) release() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refs--
	if s.refs > 0 || s.p == nil {
		return nil
	}
	c := s.close
	s.p, s.close = nil, nil
	return c()
}

// opOf turns a shared process into a setupFunc for one of its ops.
func (s *shared) opOf(op string) setupFunc {
	return func() (Op, func() error, error) {
		p, release, err := s.acquire()
		if err != nil {
			return nil, nil, err
		}
		return p.Op(op), release, nil
	}
}

func newSyncManager() *shared {
	return &shared{start: func() (*proc, func() error, error) {
		return startScript("syncmanager_bench.py", syncManagerScript, "",
			strconv.Itoa(numKeys), strconv.Itoa(valueSize))
	}}
}

// newNumpy is a numpy process holding an h of each of sizes.
func newNumpy(sizes ...kernelSize) *shared {
	return &shared{start: func() (*proc, func() error, error) {
		args := []string{strconv.Itoa(kernelD)}
		for _, k := range sizes {
			args = append(args, k.Tag+":"+strconv.Itoa(k.T))
		}
		return startScript("numpy_bench.py", numpyScript, "numpy", args...)
	}}
}

// notePaths is a post for the group holding s's ops: each measured figure named in ops (figure
// name → op) gets a note naming the path its gets took in the worker (python_keys_bench.py's
// op_path: the _fastkeys extension or ctypes, through the C reader or shared slots), as the
// ready line's info says ("...; op get: PATH; op getctypes: PATH"), ahead of any note it had.
func (s *shared) notePaths(ops map[string]string) func([]figure) []figure {
	return func(figs []figure) []figure {
		s.mu.Lock()
		info := s.info
		s.mu.Unlock()
		for i := range figs {
			f := &figs[i]
			op, ok := ops[f.Name]
			if !ok || f.Skipped != "" {
				continue
			}
			path := opPath(info, op)
			if path == "" {
				path = "not reported by the worker"
			}
			f.Note = strings.TrimSuffix("get path: "+path+"; "+f.Note, "; ")
		}
		return figs
	}
}

// opPath is the path op's gets took, from a Python worker's ready-line info; "" if not there.
func opPath(info, op string) string {
	for _, part := range strings.Split(info, "; ") {
		if p, ok := strings.CutPrefix(part, "op "+op+": "); ok {
			return p
		}
	}
	return ""
}

// thenPost runs a group's posts in order (nil ones skipped).
func thenPost(posts ...func([]figure) []figure) func([]figure) []figure {
	return func(figs []figure) []figure {
		for _, p := range posts {
			if p != nil {
				figs = p(figs)
			}
		}
		return figs
	}
}
