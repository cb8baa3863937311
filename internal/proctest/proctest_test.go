package proctest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

const roleEnv = "PROCTEST_ROLE"

// TestHelperProcess is the child: it echoes each line and exits on "exit".
func TestHelperProcess(t *testing.T) {
	if os.Getenv(roleEnv) != "echo" {
		t.Skip("helper process for this package's tests")
	}
	fmt.Println("ok ready " + os.Getenv("PROCTEST_SECRET"))
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "exit" {
			os.Exit(0)
		}
		fmt.Println(sc.Text())
	}
	os.Exit(0)
}

func echo(t *testing.T) *Proc {
	t.Setenv("PROCTEST_SECRET", "leaked")
	cmd := Command(os.Args[0], []string{"-test.run=^TestHelperProcess$"}, []string{"PROCTEST_SECRET="}, roleEnv+"=echo")
	p := Start(t, cmd)
	require.Equal(t, "ok ready", strings.TrimSpace(p.Line())) // the dropped variable did not reach the child
	return p
}

func TestDoKill(t *testing.T) {
	p := echo(t)
	require.Equal(t, "hello", p.Do("hello"))
	require.Equal(t, "x", p.OK("ok x"))
	p.Kill()
	ws, ok := p.Cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled())
	require.Equal(t, syscall.SIGKILL, ws.Signal())
	p.Kill() // reaped: a second Kill does nothing
}

func TestExit(t *testing.T) {
	p := echo(t)
	p.Exit()
	require.True(t, p.Cmd.ProcessState.Exited())
	require.Equal(t, 0, p.Cmd.ProcessState.ExitCode())
	_, open := <-p.Lines
	require.False(t, open, "Lines is closed once the child is gone")
}

func TestSentinels(t *testing.T) {
	errA, errB := errors.New("a"), errors.New("b")
	s := Sentinels{{"ErrA", errA}, {"ErrB", errB}}
	require.Equal(t, "ErrB", s.Name(fmt.Errorf("wrapped: %w", errB)))
	require.Equal(t, "other:x y", s.Name(errors.New("x\ny")))
	require.Equal(t, "err ErrA", s.Reply(errA, "ignored"))
	require.Equal(t, "ok 42", s.Reply(nil, "42"))
	require.Equal(t, "ok", s.Reply(nil, ""))
}
