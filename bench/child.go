package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrChild reports a child process that failed to start, answered with an
// error, or broke the round protocol; the message carries its stderr tail.
var ErrChild = errors.New("shmsteer: bench: child process failed")

// ErrChildTimeout reports a child that did not answer in time; it is killed.
var ErrChildTimeout = errors.New("shmsteer: bench: child process timed out")

// ErrUnknownRole reports a child started with a role nobody registered.
var ErrUnknownRole = errors.New("shmsteer: bench: unknown child role")

// childEnv selects the child role of a re-executed binary. cmd/shmsteer must
// call [RunChildIfRequested] first thing in main, before parsing flags, so a
// bench child never runs the CLI.
const childEnv = "SHMSTEER_BENCH_CHILD"

// The round protocol, shared by Go children and the Python scripts:
//
//	child  → parent  {"ready":true}              once, after its setup
//	parent → child   "<op> <n>\n"                run op n times
//	parent → child   "<op> <n> at=<unix ns>\n"   the same, starting at that wall-clock
//	                                             instant, and timed from it (Go children)
//	child  → parent  {"ns":<total elapsed ns>}   timed by the child itself
//	                 {"error":"..."}             instead, on failure
//
// EOF on the child's stdin (or a "quit" line) ends it. One command at a time
// lets the parent interleave child rounds with in-process contenders, which
// is what keeps the alternation A B A B across process boundaries.
type reply struct {
	Ready bool   `json:"ready"`
	NS    int64  `json:"ns"`
	Error string `json:"error"`
	Info  string `json:"info"`
}

// proc is a running child process driven by the round protocol.
type proc struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string // closed when the child's stdout ends
	stderr  *tail
	timeout time.Duration
	waited  chan struct{}
	waitErr error

	mu     sync.Mutex // one command in flight
	closed bool
	// Info is the "info" field of the child's ready line, e.g. the Python
	// version, for skip reasons and logs.
	Info string
}

// startProc starts cmd (which must not have Stdin/Stdout/Stderr set) and
// waits for its ready line. timeout bounds the ready wait and every later
// command. The child gets its own process group and, on Linux, dies with the
// parent, so an interrupted bench leaves nothing behind.
func startProc(name string, cmd *exec.Cmd, timeout time.Duration) (*proc, error) {
	p := &proc{name: name, cmd: cmd, lines: make(chan string, 1), stderr: &tail{max: 4096}, timeout: timeout, waited: make(chan struct{})}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrChild, name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrChild, name, err)
	}
	cmd.Stderr = p.stderr
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrChild, name, err)
	}
	p.stdin = stdin
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		// Wait only after stdout is drained: Wait closes the pipe, and an
		// earlier call could drop the child's last (error) line.
		p.waitErr = cmd.Wait()
		close(p.waited)
	}()
	r, err := p.read()
	if err == nil && !r.Ready {
		err = fmt.Errorf("%w: %s: expected ready line", ErrChild, name)
	}
	if err != nil {
		_ = p.kill()
		return nil, err
	}
	p.Info = r.Info
	return p, nil
}

// read waits for one reply line.
func (p *proc) read() (reply, error) {
	var r reply
	select {
	case line, ok := <-p.lines:
		if !ok {
			// Give Wait a moment so the exit status and stderr are complete.
			select {
			case <-p.waited:
			case <-time.After(time.Second):
			}
			return r, fmt.Errorf("%w: %s exited (%v): %s", ErrChild, p.name, p.waitErr, p.stderr)
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return r, fmt.Errorf("%w: %s: bad line %q: %w", ErrChild, p.name, line, err)
		}
		if r.Error != "" {
			return r, fmt.Errorf("%w: %s: %s", ErrChild, p.name, r.Error)
		}
		return r, nil
	case <-time.After(p.timeout):
		_ = p.kill()
		return r, fmt.Errorf("%w: %s after %v: %s", ErrChildTimeout, p.name, p.timeout, p.stderr)
	}
}

// runFigures asks the child to run op n times and returns the duration it measured.
func (p *proc) Run(op string, n int) (time.Duration, error) {
	return p.command(op + " " + strconv.Itoa(n))
}

// command sends one command line and waits for the child's duration.
func (p *proc) command(cmd string) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, fmt.Errorf("%w: %s: already closed", ErrChild, p.name)
	}
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return 0, fmt.Errorf("%w: %s: %w: %s", ErrChild, p.name, err, p.stderr)
	}
	r, err := p.read()
	if err != nil {
		return 0, err
	}
	return time.Duration(r.NS), nil
}

// RunAt is Run with an aligned start: the child waits until the wall-clock instant at, runs op
// n times, and returns the time from at to its last op (so a child scheduled late pays for it).
// Children started at one instant measure one shared window; Go children only.
func (p *proc) RunAt(op string, n int, at time.Time) (time.Duration, error) {
	return p.command(op + " " + strconv.Itoa(n) + " at=" + strconv.FormatInt(at.UnixNano(), 10))
}

// Pid is the child's process id, e.g. to read its /proc files.
func (p *proc) Pid() int { return p.cmd.Process.Pid }

// Op returns the child's op as an [Op].
func (p *proc) Op(op string) Op {
	return func(n int) (time.Duration, error) { return p.Run(op, n) }
}

// Close ends the child: EOF on its stdin, then a kill of its process group
// if it has not exited within a few seconds. It waits for the exit either way.
func (p *proc) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	_ = p.stdin.Close()
	select {
	case <-p.waited:
	case <-time.After(5 * time.Second):
		_ = p.kill()
		return fmt.Errorf("%w: %s did not exit on EOF; killed", ErrChildTimeout, p.name)
	}
	// The child is gone; kill its group in case it left helpers (Python's
	// manager or worker processes) behind.
	_ = killGroup(p.cmd)
	if p.waitErr != nil {
		return fmt.Errorf("%w: %s: %v: %s", ErrChild, p.name, p.waitErr, p.stderr)
	}
	return nil
}

func (p *proc) kill() error {
	err := killGroup(p.cmd)
	<-p.waited
	return err
}

// tail keeps the last max bytes written, for error messages.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, b...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.b))
	if s == "" {
		return "(no stderr)"
	}
	return s
}

// ChildFunc sets up a child role from its arguments and returns its ops by
// name, plus an optional cleanup. It runs inside the child process.
type ChildFunc func(args []string) (ops map[string]Op, cleanup func() error, err error)

// startChild re-executes the running binary as a child in the given role,
// with args as its os.Args[1:], and waits for it to be ready. The binary's
// main must call [RunChildIfRequested] with a map that has the role (the
// built-in roles are always there).
func startChild(role string, args ...string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrChild, role, err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"="+role)
	return startProc(role, cmd, childTimeout)
}

// childTimeout bounds one child command. Rounds last tens of milliseconds;
// the margin is for setups and a machine shared with other work.
const childTimeout = 60 * time.Second

// builtinRoles are always available to [RunChildIfRequested].
var builtinRoles = map[string]ChildFunc{
	"bench.gomap": gomapChild,
	keysChildRole: keysChild,
}

// RunChildIfRequested returns at once unless childEnv is set. If it is, this
// process is a bench child: it sets up the role from roles (or a built-in
// role), serves the round protocol on stdin/stdout and exits the process, so
// it never returns. Call it first thing in main. Anything the role prints to
// stdout breaks the protocol; log to stderr.
func RunChildIfRequested(roles map[string]ChildFunc) {
	role, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	os.Exit(serveChild(role, roles, os.Args[1:], os.Stdin, os.Stdout))
}

func serveChild(role string, roles map[string]ChildFunc, args []string, in io.Reader, out io.Writer) int {
	enc := json.NewEncoder(out)
	fail := func(err error) int {
		_ = enc.Encode(reply{Error: err.Error()})
		return 1
	}
	fn := roles[role]
	if fn == nil {
		fn = builtinRoles[role]
	}
	if fn == nil {
		return fail(fmt.Errorf("%w: %q", ErrUnknownRole, role))
	}
	ops, cleanup, err := fn(args)
	if err != nil {
		return fail(err)
	}
	if cleanup != nil {
		defer func() { _ = cleanup() }()
	}
	if err := enc.Encode(reply{Ready: true}); err != nil {
		return 1
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "quit" {
			break
		}
		var r reply
		n, err := 0, error(nil)
		var at time.Time
		if len(f) != 2 && len(f) != 3 {
			err = fmt.Errorf("bad command %q", sc.Text())
		} else if n, err = strconv.Atoi(f[1]); err == nil && n < 1 {
			err = fmt.Errorf("bad count %d", n)
		}
		if err == nil && len(f) == 3 {
			ns, ok := strings.CutPrefix(f[2], "at=")
			var t int64
			if t, err = strconv.ParseInt(ns, 10, 64); !ok || err != nil {
				err = fmt.Errorf("bad start %q", f[2])
			}
			at = time.Unix(0, t) // wall clock only: comparable across processes
		}
		if op := ops[f[0]]; err == nil && op == nil {
			err = fmt.Errorf("unknown op %q", f[0])
		} else if err == nil {
			if !at.IsZero() {
				// Sleep to just short of the instant, then spin: a sleeper's wake-up
				// is late by up to a scheduler tick, which would land in the window.
				if d := time.Until(at); d > time.Millisecond {
					time.Sleep(d - time.Millisecond)
				}
				for time.Now().Before(at) {
				}
			}
			var d time.Duration
			d, err = op(n)
			if !at.IsZero() {
				d = time.Since(at)
			}
			r.NS = d.Nanoseconds()
		}
		if err != nil {
			r = reply{Error: err.Error()}
		}
		if err := enc.Encode(r); err != nil {
			return 1
		}
	}
	return 0
}
