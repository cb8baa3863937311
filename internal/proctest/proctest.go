// Package proctest runs the child processes of shmsteer's multi-process tests.
//
// It owns the harness only: a test binary re-executes itself (Command), the child answers line
// commands on stdin with lines on stdout, and the parent reads them with a timeout (Start, Do,
// Line), kills the child at a point of its choosing (Kill) and reaps it at the test's end. What
// a child does in its role, the commands it understands and the invariants checked after a
// kill stay in each package's tests; this package must not know any of them, and only tests
// import it.
//
// How to start:
//
//	cmd := proctest.Command(os.Args[0], []string{"-test.run=^TestHelperProcess$"},
//		[]string{"SHMSTEER_TEST_"}, "SHMSTEER_TEST_ROLE=owner")
//	p := proctest.Start(t, cmd)
//	require.Equal(t, "ok ready", p.Line())
//	p.Do("set k v")
//	p.Kill()
package proctest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// DefaultTimeout is how long Line waits for a child's answer before failing the test.
const DefaultTimeout = 60 * time.Second

// maxLine is the longest answer line a child may print.
const maxLine = 1 << 20

// Proc is a running child process speaking the line protocol.
type Proc struct {
	// Cmd is the started command; Cmd.Process.Pid names the child.
	Cmd *exec.Cmd
	// Stdin is the child's standard input, where commands go one per line.
	Stdin io.WriteCloser
	// Lines delivers the child's output lines; it is closed when the child's stdout closes.
	Lines <-chan string
	// Timeout bounds Line's wait; DefaultTimeout unless changed after Start.
	Timeout time.Duration

	t testing.TB
}

// Command is exe (the test binary or a copy of it) run with args, with this process's
// environment less every variable whose name starts with one of drop (so a parent's secret
// or another test's settings never leak into the child), plus env; its stderr is ours.
func Command(exe string, args, drop []string, env ...string) *exec.Cmd {
	cmd := exec.Command(exe, args...)
	for _, kv := range os.Environ() {
		keep := true
		for _, prefix := range drop {
			if strings.HasPrefix(kv, prefix) {
				keep = false
				break
			}
		}
		if keep {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// Start starts cmd and reads its answers line by line; the child is SIGKILLed and reaped when
// the test ends, if it has not exited before.
func Start(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := make(chan string, 16)
	p := &Proc{Cmd: cmd, Stdin: in, Lines: lines, Timeout: DefaultTimeout, t: t}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, maxLine)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	t.Cleanup(p.Kill)
	return p
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Line is the child's next output line; the test fails if the child exits or stays silent
// for Timeout.
func (p *Proc) Line() string {
	p.t.Helper()
	select {
	case l, ok := <-p.Lines:
		if !ok {
			p.t.Fatalf("child %d exited", p.Pid())
		}
		return l
	case <-time.After(p.Timeout):
		p.t.Fatalf("child %d did not answer within %v", p.Pid(), p.Timeout)
	}
	return ""
}

// Send writes one command line to the child without waiting for an answer.
func (p *Proc) Send(cmd string) {
	p.t.Helper()
	_, err := fmt.Fprintln(p.Stdin, cmd)
	require.NoError(p.t, err)
}

// Do sends one command line and returns the child's answer line.
func (p *Proc) Do(cmd string) string {
	p.t.Helper()
	p.Send(cmd)
	return p.Line()
}

// OK sends one command line, fails the test unless the answer starts with "ok", and returns
// the rest of the answer.
func (p *Proc) OK(cmd string) string {
	p.t.Helper()
	l := p.Do(cmd)
	require.True(p.t, strings.HasPrefix(l, "ok"), "%s: %s", cmd, l)
	return strings.TrimSpace(strings.TrimPrefix(l, "ok"))
}

// Kill SIGKILLs the child and reaps it; it does nothing once the child was reaped.
func (p *Proc) Kill() {
	if p.Cmd.ProcessState != nil {
		return
	}
	p.Cmd.Process.Signal(syscall.SIGKILL)
	p.Cmd.Wait()
}

// Exit asks the child to exit (the command "exit") and reaps it.
func (p *Proc) Exit() {
	fmt.Fprintln(p.Stdin, "exit")
	p.Cmd.Wait()
}

// Sentinels names the errors a child reports by name: a line protocol carries "err NAME",
// not the error itself.
type Sentinels []struct {
	Name string
	Err  error
}

// Name is the name of the first sentinel err wraps, or "other:" and err's text.
func (s Sentinels) Name(err error) string {
	for _, e := range s {
		if errors.Is(err, e.Err) {
			return e.Name
		}
	}
	return "other:" + strings.ReplaceAll(err.Error(), "\n", " ")
}

// Reply is a child's answer line: "err NAME" for an error, else "ok" and ok.
func (s Sentinels) Reply(err error, ok string) string {
	if err != nil {
		return "err " + s.Name(err)
	}
	return strings.TrimSpace("ok " + ok)
}
