package ipc

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// nobody is the uid (and gid) the other-user client runs as.
const nobody = 65534

// TestPeerCredentials attaches from a process of another uid: refused with ErrAuthFailed
// unless the owner allows that uid. It needs root to start the child as another user.
func TestPeerCredentials(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another uid")
	}
	// The test binary sits in a private build directory: copy it where nobody can run it.
	dir, err := os.MkdirTemp("", "shmsteer-uid-")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	require.NoError(t, os.Chmod(dir, 0o755))
	exe := filepath.Join(dir, "ipc.test")
	src, err := os.Open(os.Args[0])
	require.NoError(t, err)
	dst, err := os.OpenFile(exe, os.O_CREATE|os.O_WRONLY, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, errors.Join(src.Close(), dst.Close()))

	attachAsNobody := func(env testEnv, ownerUIDs string) string {
		cmd := exec.Command(exe, "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = []string{roleEnv + "=client", nsEnv + "=" + env.ns, SecretEnv + "=" + env.secretStr, ownerUIDsEnv + "=" + ownerUIDs, "HOME=" + dir, "TMPDIR=" + dir}
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}, Pdeathsig: syscall.SIGKILL}
		cmd.Stdin = strings.NewReader("exit\n")
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		line, _ := bufio.NewReader(out).ReadString('\n')
		cmd.Process.Kill()
		cmd.Wait()
		return strings.TrimSpace(line)
	}

	for _, tt := range []struct {
		name      string
		allow     []int
		ownerUIDs string // the client's OwnerUIDs
		want      string
	}{
		{"other uid refused", nil, "0", "err ErrAuthFailed"},
		{"other uid allowed", []int{nobody}, "0", "ok ready"},
		// The client does not accept the owner's uid (root): it skips its listener.
		{"owner uid not accepted", []int{nobody}, "", "err ErrNotYetInitialized"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv()
			opts := env.ownerOpts()
			opts.AllowUIDs = tt.allow
			o := newTestOwner(t, opts)
			require.Equal(t, tt.want, attachAsNobody(env, tt.ownerUIDs))
			if tt.want != "ok ready" {
				require.Zero(t, o.Clients(), "nothing attached")
			}
		})
	}
}

// TestRefusedUIDOneMessage: a client of a uid the owner does not allow gets the same error,
// sentinel and text, on every attach, whatever the timing of the owner's refusal.
func TestRefusedUIDOneMessage(t *testing.T) {
	exe := nobodyExe(t)
	env := newTestEnv()
	newTestOwner(t, env.ownerOpts())
	p := startProcAs(t, exe, nobodyCred, "probe", env.childEnv()...)
	require.Equal(t, "ok ready", p.Line())
	require.Equal(t, "ok 1 ErrAuthFailed: "+msgUIDRefused, p.Do("attachn 50"))
	p.Exit()
}
