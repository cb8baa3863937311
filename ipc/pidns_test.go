package ipc

import (
	"github.com/shmsteer/shmsteer/internal/proctest"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Workers in containers: a shared network namespace (the abstract socket is reachable) and a
// PID namespace of their own, with their own /proc or the host's.

const mountProcEnv = "SHMSTEER_TEST_MOUNTPROC"

func init() {
	// A child started in new PID and mount namespaces mounts a /proc of its own, as
	// `unshare --pid --fork --mount-proc` does, before anything reads /proc.
	if os.Getenv(mountProcEnv) == "1" {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err == nil {
			unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		}
	}
}

// startProcNS is startProc with the child in a new PID namespace; it skips where the kernel
// does not allow that.
func startProcNS(t *testing.T, ownProc bool, role string, env ...string) *proc {
	t.Helper()
	flags := uintptr(syscall.CLONE_NEWPID)
	if ownProc {
		flags |= syscall.CLONE_NEWNS
		env = append(env, mountProcEnv+"=1")
	}
	probe := exec.Command("/bin/true")
	probe.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
	if err := probe.Run(); err != nil {
		t.Skipf("cannot start a process in a new PID namespace here (%v): needs root or user namespaces", err)
	}
	cmd := helperCmd(os.Args[0], role, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}
	return proctest.Start(t, cmd)
}

// TestProcClientKilledPIDNamespace is TestProcClientKilled with the clients in PID namespaces
// of their own: the owner frees a killed client's reader slot within a second by itself (no
// write needed), and never touches a live client's.
func TestProcClientKilledPIDNamespace(t *testing.T) {
	for _, ownProc := range []bool{false, true} {
		name := map[bool]string{false: "host-proc", true: "own-proc"}[ownProc]
		t.Run(name, func(t *testing.T) {
			env := newTestEnv()
			o := newTestOwner(t, env.ownerOpts())
			require.NoError(t, ownerStore(o).Set("req", []byte("k")))
			base := o.Region().Stats().ReadersClaimed
			kids := []*proc{startProcNS(t, ownProc, "client", env.childEnv()...), startProcNS(t, ownProc, "client", env.childEnv()...)}
			for _, p := range kids {
				require.Equal(t, "ok ready", p.Line())
				require.Equal(t, "ok "+hexOf("k"), p.Do("get req")) // claims a reader slot
			}
			require.Equal(t, base+2, o.Region().Stats().ReadersClaimed)
			// Some time passes: a pid-based owner would by now have cleared the slots of
			// own-proc clients (their pid 1 is the host's init in the owner's view).
			time.Sleep(2 * sweepEvery)
			require.Equal(t, base+2, o.Region().Stats().ReadersClaimed, "live clients keep their slots")

			killed := time.Now()
			kids[0].Kill()
			for o.Region().Stats().ReadersClaimed != base+1 {
				require.Less(t, time.Since(killed), time.Second, "the killed client's slot is freed within a second")
				time.Sleep(time.Millisecond)
			}
			t.Logf("%s: killed client's slot freed after %v", name, time.Since(killed))
			require.Equal(t, "ok "+hexOf("k"), kids[1].Do("get req"), "the other client is untouched")
			require.Equal(t, base+1, o.Region().Stats().ReadersClaimed)
		})
	}
}
