package bench

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// requireGroupGone checks that no process of the child's group is left.
func requireGroupGone(t *testing.T, pid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return syscall.Kill(-pid, 0) == syscall.ESRCH
	}, 5*time.Second, 20*time.Millisecond, "process group %d still has members", pid)
}

func TestSyncManagerDriver(t *testing.T) {
	if _, err := findPython(""); err != nil {
		t.Skipf("python3 not available: %v", err)
	}
	sm := newSyncManager()
	p, release, err := sm.acquire()
	require.NoError(t, err)
	pid := p.cmd.Process.Pid
	t.Cleanup(func() { _ = release() })
	require.Contains(t, p.Info, "python")
	for _, op := range []string{"get", "set"} {
		d, err := p.Run(op, 20)
		require.NoError(t, err, op)
		// Each op is a round trip to the manager process: microseconds at
		// least, seconds would mean something is broken.
		perOp := d / 20
		require.Greater(t, perOp, time.Microsecond, op)
		require.Less(t, perOp, 100*time.Millisecond, op)
	}
	_, err = p.Run("delete", 1)
	require.ErrorContains(t, err, "unknown op")

	// The two contenders share the process; it ends with the last release.
	op2, release2, err := sm.opOf("set")()
	require.NoError(t, err)
	_, err = op2(3)
	require.NoError(t, err)
	require.NoError(t, release2())
	_, err = p.Run("get", 1)
	require.NoError(t, err, "still held by the first user")
	require.NoError(t, release())
	requireGroupGone(t, pid)
}

func TestNumpyDriver(t *testing.T) {
	if _, err := findPython("numpy"); err != nil {
		t.Skipf("numpy not available: %v", err)
	}
	np := newNumpy(sharedNumpySizes()...)
	p, release, err := np.acquire()
	require.NoError(t, err)
	pid := p.cmd.Process.Pid
	t.Cleanup(func() { _ = release() })
	require.Contains(t, p.Info, "numpy")
	for _, k := range kernelSizes[:2] {
		d, err := p.Run("add."+k.Tag, 5)
		require.NoError(t, err)
		require.Positive(t, d)
	}
	_, err = p.Run("add.1g", 1)
	require.ErrorContains(t, err, "bad command")
	require.NoError(t, release())
	requireGroupGone(t, pid)
}

func TestRedisBaseline(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skipf("redis-server not on PATH: %v", err)
	}
	rd := &redisShared{}
	get, relGet, err := rd.setup("get")()
	require.NoError(t, err)
	pid := rd.s.cmd.Process.Pid
	set, relSet, err := rd.setup("set")()
	require.NoError(t, err)
	for _, op := range []Op{get, set, get} {
		d, err := op(50)
		require.NoError(t, err)
		require.Positive(t, d)
	}
	require.NoError(t, relGet())
	require.NoError(t, relSet())
	requireGroupGone(t, pid)
}

func TestSkippedWithoutTools(t *testing.T) {
	// With no interpreter and no redis-server on PATH the baselines must be
	// skipped with a reason, not fail or be estimated.
	t.Setenv("PATH", t.TempDir())
	old := interpreters
	interpreters = []string{"python3"}
	t.Cleanup(func() { interpreters = old })
	cfg := tiny()
	cfg.Only = []string{"keys.get.syncmanager", "keys.get.redis", "kernels.add.16k.numpy"}
	rep := runFigures(cfg, sources{})
	require.Len(t, rep.Figures, 3)
	require.Empty(t, rep.Measured())
	for _, f := range rep.Figures {
		switch f.Name {
		case "keys.get.syncmanager_ns":
			require.Contains(t, f.Skipped, ErrNoPython.Error())
		case "keys.get.redis_ns":
			require.Contains(t, f.Skipped, ErrNoRedis.Error())
		case "kernels.add.16k.numpy_ns":
			require.Contains(t, f.Skipped, ErrNoNumpy.Error())
		default:
			t.Fatalf("unexpected figure %s", f.Name)
		}
	}
}
