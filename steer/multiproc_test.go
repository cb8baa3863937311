package steer

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
)

// Child roles: the test binary re-executes itself with STEER_TEST_ROLE set.
const roleEnv = "STEER_TEST_ROLE"

type childResult struct {
	Latch    []uint64 // latch state hash after every operation, FIFO then LRU
	Sums     []uint64 // step checksums
	Floats   uint64   // hash of every output float
	Status   Status
	Latches  uint64 // engine latch state hash after the scenario
	Fires    uint64 // gates fired (gates_multiproc_test.go)
	ErrorMsg string
}

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(m.Run())
	case "determinism":
		out(determinismRun())
	case "apply":
		out(applyRun())
	case "merge":
		out(mergeRun())
	case "gates":
		out(gatesRankRun())
	case "colreader":
		colReaderRun()
	}
	os.Exit(0)
}

func out(r childResult) {
	json.NewEncoder(os.Stdout).Encode(r)
}

// determinismRun replays the fixed operation sequence in a fresh region of this process.
func determinismRun() childResult {
	var r childResult
	r.Latch = append(latchOps(11, 2000, FIFO), latchOps(11, 2000, LRU)...)
	rc, _ := RegionConfig(smallCfg, shm.Config{IndexSlots: 1 << 12, ArenaBytes: 32 << 20})
	reg, err := shm.Create(rc)
	if err != nil {
		r.ErrorMsg = err.Error()
		return r
	}
	defer reg.Close()
	e, err := Open(reg, &smallCfg, Options{Logf: func(string, ...any) {}})
	if err != nil {
		r.ErrorMsg = err.Error()
		return r
	}
	_, ids, err := scenario(e, 5)
	if err == nil {
		r.Sums, r.Floats, err = runSteps(e.Engine, 5, ids, 4, 0, nil)
	}
	if err != nil {
		r.ErrorMsg = err.Error()
	}
	r.Latches = e.Latches().StateHash()
	r.Status, _ = e.Status()
	r.Status.ArenaUsed, r.Status.ArenaFree, r.Status.ColumnsUsed, r.Status.ColumnsRetired = 0, 0, 0, 0 // depend on reclamation timing
	return r
}

// applyRun attaches to the parent's region (fds 3 and 4) and applies steps at a pinned version.
func applyRun() childResult {
	var r childResult
	reg, err := shm.Open(os.NewFile(3, "data"), os.NewFile(4, "readers"))
	if err != nil {
		r.ErrorMsg = err.Error()
		return r
	}
	defer reg.Close()
	e, err := Attach(reg, &smallCfg, Options{})
	if err != nil {
		r.ErrorMsg = err.Error()
		return r
	}
	v, _ := strconv.ParseUint(os.Getenv("STEER_TEST_VERSION"), 10, 64)
	r.Sums, r.Floats, err = runSteps(e.Engine, 9, strings.Split(os.Getenv("STEER_TEST_IDS"), ","), 6, v, nil)
	if err != nil {
		r.ErrorMsg = err.Error()
	}
	return r
}

func runChild(t *testing.T, role string, env []string, files ...*os.File) childResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), roleEnv+"="+role), env...)
	cmd.ExtraFiles = files
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	require.NoError(t, err)
	var r childResult
	require.NoError(t, json.Unmarshal(b, &r), string(b))
	require.Empty(t, r.ErrorMsg)
	return r
}

// TestDeterminismAcrossProcesses feeds the same latch and admission sequence to two processes
// (this one and a child) and requires identical latch states, step checksums and floats.
func TestDeterminismAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	local := determinismRun()
	require.Empty(t, local.ErrorMsg)
	child := runChild(t, "determinism", nil)
	require.Equal(t, local.Latch, child.Latch)
	require.Equal(t, local.Latches, child.Latches)
	require.Equal(t, local.Sums, child.Sums)
	require.Equal(t, local.Floats, child.Floats)
	require.Equal(t, local.Status, child.Status)
	require.NotZero(t, local.Status.Triggers)
}

// TestApplyEqualAcrossProcesses has two child processes attach to this process's region and
// apply the same steps at a version pinned before the owner goes on writing; both must match
// each other and this process exactly.
func TestApplyEqualAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	e := newOwner(t, smallCfg, Options{})
	_, ids, err := scenario(e, 9)
	require.NoError(t, err)
	st := e.NewStepper()
	require.NoError(t, st.Begin(0)) // hold the version so it cannot be reclaimed
	pinned := st.Version()
	defer st.Close()
	want, wantFloats, err := runSteps(e.Engine, 9, ids, 6, pinned, nil)
	require.NoError(t, err)

	// The owner keeps writing: the children must still see the pinned state.
	_, err = e.SetGlobal(Steering{})
	require.NoError(t, err)
	for _, id := range ids[:5] {
		_, err = e.End(id)
		require.NoError(t, err)
	}
	data, readers := e.Region().Files()
	env := []string{"STEER_TEST_VERSION=" + fmt.Sprint(pinned), "STEER_TEST_IDS=" + strings.Join(ids, ",")}
	for range 2 {
		r := runChild(t, "apply", env, data, readers)
		require.Equal(t, want, r.Sums)
		require.Equal(t, wantFloats, r.Floats)
	}
	now, _, err := runSteps(e.Engine, 9, ids, 6, 0, nil)
	require.NoError(t, err)
	require.NotEqual(t, want, now, "the current state differs from the pinned one")
}
