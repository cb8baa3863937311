//go:build linux

package shm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Child processes are this test binary re-executed with SHMSTEER_SHM_ROLE set; they get the
// region's two memfds as fds 3 and 4 and report on stdout.
const roleEnv = "SHMSTEER_SHM_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

const (
	testKind    Kind = 7
	vectorKind  Kind = 8
	genKey           = "generation"
	childKeys        = 48
	childVector      = 4096
)

func childKey(i int) string { return fmt.Sprintf("req-%04d-%s", i, strings.Repeat("x", i%29)) }

// makeValue builds the value of key at generation gen: a header naming both, a payload that is
// a pure function of them, and a checksum, so a reader can tell a whole written value from a
// torn or reused one.
func makeValue(key string, gen uint64) []byte {
	rng := rand.New(rand.NewPCG(gen, uint64(crc32.ChecksumIEEE([]byte(key)))))
	n := 16 + rng.IntN(200)
	if gen%5 == 0 {
		n += 4096 // some values cross many cache lines
	}
	b := make([]byte, 16+n+4)
	binary.LittleEndian.PutUint64(b[0:], gen)
	binary.LittleEndian.PutUint64(b[8:], uint64(crc32.ChecksumIEEE([]byte(key))))
	for i := 16; i < 16+n; i++ {
		b[i] = byte(rng.Uint32())
	}
	binary.LittleEndian.PutUint32(b[16+n:], crc32.ChecksumIEEE(b[:16+n]))
	return b
}

// checkValue verifies a value read for key and returns its generation.
func checkValue(key string, v []byte) (uint64, error) {
	if len(v) < 20 {
		return 0, fmt.Errorf("value of %s too short: %d", key, len(v))
	}
	n := len(v) - 4
	if crc32.ChecksumIEEE(v[:n]) != binary.LittleEndian.Uint32(v[n:]) {
		return 0, fmt.Errorf("value of %s torn: checksum mismatch", key)
	}
	if binary.LittleEndian.Uint64(v[8:]) != uint64(crc32.ChecksumIEEE([]byte(key))) {
		return 0, fmt.Errorf("value of %s belongs to another key", key)
	}
	gen := binary.LittleEndian.Uint64(v)
	if want := makeValue(key, gen); string(want) != string(v) {
		return 0, fmt.Errorf("value of %s is not what generation %d wrote", key, gen)
	}
	return gen, nil
}

func vectorValue(gen uint64) []float32 {
	v := make([]float32, childVector)
	for i := range v {
		v[i] = float32(gen) + float32(i)/childVector
	}
	return v
}

// writeGeneration rewrites every key, the vector and the generation marker in one Tx.
func writeGeneration(r *Region, gen uint64) error {
	_, err := r.Update(func(tx *Tx) error {
		for i := 0; i < childKeys; i++ {
			if i%7 == int(gen%7) && gen%3 == 0 {
				if err := tx.Delete(testKind, childKey(i)); err != nil && err != ErrNotFound && !isNotFound(err) {
					return err
				}
				continue
			}
			if err := tx.Put(testKind, childKey(i), makeValue(childKey(i), gen)); err != nil {
				return err
			}
		}
		if err := tx.PutFloat32(vectorKind, "vec", vectorValue(gen)); err != nil {
			return err
		}
		var g [8]byte
		binary.LittleEndian.PutUint64(g[:], gen)
		return tx.Put(testKind, genKey, g[:])
	})
	return err
}

func isNotFound(err error) bool {
	return err != nil && strings.Contains(err.Error(), ErrNotFound.Error())
}

func startChildren(t *testing.T, r *Region, role string, n int, extraEnv ...string) []*exec.Cmd {
	t.Helper()
	data, readers := r.Files()
	var cmds []*exec.Cmd
	for i := 0; i < n; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), roleEnv+"="+role, "SHMSTEER_SHM_CHILD="+strconv.Itoa(i))
		cmd.Env = append(cmd.Env, extraEnv...)
		cmd.ExtraFiles = []*os.File{data, readers}
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		cmds = append(cmds, cmd)
	}
	// A failed assertion must not leave children looping: kill whatever still runs.
	t.Cleanup(func() {
		for _, c := range cmds {
			if c.Process != nil && c.ProcessState == nil {
				c.Process.Kill()
				c.Wait()
			}
		}
	})
	return cmds
}

func openChildRegion() (*Region, error) {
	return Open(os.NewFile(3, "data"), os.NewFile(4, "readers"))
}

func runChild(role string) int {
	if os.Getenv(mountProcEnv) == "1" {
		if err := mountOwnProc(); err != nil {
			fmt.Println("ERR mount /proc:", err)
			return 2
		}
	}
	if role == "writer" { // creates its own region
		return childWriter()
	}
	r, err := openChildRegion()
	if err != nil {
		fmt.Println("ERR open:", err)
		return 2
	}
	defer r.Close()
	switch role {
	case "verify":
		return childVerify(r)
	case "hold":
		return childHold(r)
	case "hold-lease":
		return childHoldLease(r)
	case "colverify":
		return childColVerify(r)
	case "pin-stop":
		return childPinStop(r)
	case "bench-get":
		n, _ := strconv.Atoi(os.Getenv("SHMSTEER_SHM_N"))
		return childGetLoop(r, max(n, 1))
	}
	fmt.Println("ERR unknown role", role)
	return 2
}

// childVerify reads continuously until the generation marker reaches its stop value: plain
// Gets through a Reader and through the Region, and snapshots in which every key must carry the
// snapshot's generation and zero-copy views must stay unchanged until the snapshot closes.
func childVerify(r *Region) int {
	stop, _ := strconv.ParseUint(os.Getenv("SHMSTEER_SHM_STOP"), 10, 64)
	rd, err := r.NewReader()
	if err != nil {
		fmt.Println("ERR reader:", err)
		return 2
	}
	defer rd.Close()
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 1))
	var buf []byte
	gets, snaps := 0, 0
	fail := func(format string, args ...any) int {
		fmt.Printf("ERR "+format+"\n", args...)
		return 1
	}
	for {
		for i := 0; i < 200; i++ {
			k := childKey(rng.IntN(childKeys))
			if i%2 == 0 {
				buf, err = rd.Get(testKind, k, buf[:0])
			} else {
				buf, err = r.Get(testKind, k, buf[:0])
			}
			if err == ErrNotFound {
				continue
			}
			if err != nil {
				return fail("get %s: %v", k, err)
			}
			if _, err := checkValue(k, buf); err != nil {
				return fail("%v", err)
			}
			gets++
		}
		s, err := rd.Snapshot()
		if err != nil {
			return fail("snapshot: %v", err)
		}
		g, _, err := s.View(testKind, genKey)
		if err != nil {
			s.Close()
			if err == ErrNotFound {
				continue
			}
			return fail("gen: %v", err)
		}
		gen := binary.LittleEndian.Uint64(g)
		vec, _, err := s.ViewFloat32(vectorKind, "vec")
		if err != nil || len(vec) != childVector || vec[0] != float32(gen) || vec[childVector-1] != float32(gen)+float32(childVector-1)/childVector {
			s.Close()
			return fail("vector at gen %d: err %v len %d", gen, err, len(vec))
		}
		views := map[string][]byte{}
		for i := 0; i < childKeys; i++ {
			k := childKey(i)
			v, _, err := s.View(testKind, k)
			if err == ErrNotFound {
				if !(i%7 == int(gen%7) && gen%3 == 0) {
					trace := traceKey(r, k, s.Version())
					s.Close()
					return fail("%s missing at gen %d: %s", k, gen, trace)
				}
				continue
			}
			if err != nil {
				s.Close()
				return fail("view %s: %v", k, err)
			}
			vg, err := checkValue(k, v)
			if err != nil || vg != gen {
				s.Close()
				return fail("snapshot at gen %d: %s has gen %d (%v)", gen, k, vg, err)
			}
			views[k] = v
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond) // let the writer go on
		for k, v := range views {
			if vg, err := checkValue(k, v); err != nil || vg != gen {
				s.Close()
				return fail("view of %s changed while pinned: %v", k, err)
			}
		}
		if vec[0] != float32(gen) {
			s.Close()
			return fail("vector view changed while pinned")
		}
		s.Close()
		snaps++
		if gen >= stop {
			fmt.Printf("OK gets=%d snaps=%d\n", gets, snaps)
			return 0
		}
	}
}

// childHold pins snapshots for random times and reads, forever: the parent kills it.
func childHold(r *Region) int {
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 2))
	fmt.Println("READY")
	var buf []byte
	for {
		s, err := r.Snapshot()
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		for i := 0; i < 50; i++ {
			k := childKey(rng.IntN(childKeys))
			if v, _, err := s.View(testKind, k); err == nil {
				if _, err := checkValue(k, v); err != nil {
					fmt.Println("ERR", err)
					return 1
				}
			}
			buf, _ = r.Get(testKind, k, buf[:0])
		}
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
		s.Close()
	}
}

func smallRegion(t *testing.T) *Region {
	return newTestRegion(t, Config{IndexSlots: 1024, ArenaBytes: 4 << 20, ReaderSlots: 64})
}

// TestMultiProcessReaders: the owner rewrites every value continuously while reader processes
// check that each value they read is whole and was written, that snapshots see one generation,
// and that pinned views never change.
func TestMultiProcessReaders(t *testing.T) {
	r := smallRegion(t)
	require.NoError(t, writeGeneration(r, 1))
	const stop = 400
	cmds := startChildren(t, r, "verify", 3, "SHMSTEER_SHM_STOP="+strconv.Itoa(stop))
	outs := make([]*strings.Builder, len(cmds))
	for i, c := range cmds {
		outs[i] = &strings.Builder{}
		c.Stdout = outs[i]
		require.NoError(t, c.Start())
	}
	for gen := uint64(2); gen <= stop+50; gen++ {
		// A reader descheduled inside a snapshot (a loaded machine) holds reclamation back
		// and can fill the small arena: back off until it moves on, as an owner would.
		require.Eventually(t, func() bool {
			err := writeGeneration(r, gen)
			if errors.Is(err, ErrRegionFull) {
				time.Sleep(100 * time.Microsecond)
				return false
			}
			require.NoError(t, err)
			return true
		}, 20*time.Second, time.Microsecond)
		if gen%16 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	for i, c := range cmds {
		err := c.Wait()
		require.NoError(t, err, "child %d: %s", i, outs[i].String())
		require.Contains(t, outs[i].String(), "OK", outs[i].String())
	}
	require.NoError(t, r.Reclaim())
	st := r.Stats()
	require.Zero(t, st.ReadersClaimed, "children released their slots on exit")
	require.Zero(t, st.RetiredBytes)
	s, err := r.Snapshot()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Check())
}

// TestKillReaders SIGKILLs reader processes at random points, inside and outside read
// sections, while the owner writes; afterwards their slots must be cleared and everything they
// pinned reclaimed.
func TestKillReaders(t *testing.T) {
	r := smallRegion(t)
	require.NoError(t, writeGeneration(r, 1))
	cmds := startChildren(t, r, "hold", 4)
	for _, c := range cmds {
		out, err := c.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, c.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "READY\n", line)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	killAt := make([]int, len(cmds))
	for i := range killAt {
		killAt[i] = 5 + rng.IntN(200)
	}
	for gen := uint64(2); gen < 260; gen++ {
		// Readers pinning old versions can fill the arena; the owner backs off until their
		// pins move on, or until the slots of killed readers are found and cleared.
		require.Eventually(t, func() bool {
			err := writeGeneration(r, gen)
			if errors.Is(err, ErrRegionFull) {
				return false
			}
			require.NoError(t, err)
			return true
		}, 10*time.Second, time.Millisecond)
		for i, c := range cmds {
			if killAt[i] == int(gen) {
				require.NoError(t, c.Process.Signal(syscall.SIGKILL))
			}
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
	}
	for _, c := range cmds {
		err := c.Wait()
		require.Error(t, err, "killed")
	}
	require.Eventually(t, func() bool {
		require.NoError(t, r.Reclaim())
		st := r.Stats()
		return st.ReadersClaimed == 0 && st.RetiredBytes == 0
	}, 10*time.Second, 20*time.Millisecond)
	st := r.Stats()
	require.Equal(t, st.LiveBytes, st.AllocBytes, "only live values remain allocated: %+v", st)
	require.NotZero(t, st.DeadCleared)
}

// traceKey describes how a lookup of k at version v proceeds, for failure messages.
func traceKey(r *Region, k string, v uint64) string {
	kb := stringBytes(k)
	h := keyHash(r.l.hashK0, r.l.hashK1, uint64(testKind), kb)
	var out strings.Builder
	fmt.Fprintf(&out, "pinned v=%d cur=%d horizon=%d; ", v, r.Version(), load64(r.data, hHorizon))
	for i := uint64(0); i < r.l.maxProbe; i++ {
		s := (h + i) & r.l.mask()
		w := load64(r.index, s*8)
		fmt.Fprintf(&out, "[slot %d w=%#x", s, w)
		if w == 0 {
			out.WriteString(" empty]")
			break
		}
		if off, ok := wordOffset(w); ok {
			for n := 0; n < 6; n++ {
				b, err := readBlob(r.arena, off)
				fmt.Fprintf(&out, " {off %d ver %d kind %d flags %d key %q err %v}", off, b.version, b.kind, b.flags, string(arenaKey(r, b)), err)
				if err != nil || b.prev == 0 {
					break
				}
				off = (b.prev - 1) * blobAlign
			}
		}
		out.WriteString("]")
	}
	return out.String()
}

func arenaKey(r *Region, b blob) []byte {
	if b.keyLen > MaxKeyLen || b.off+bKey+b.keyLen > uint64(len(r.arena)) {
		return nil
	}
	return b.key(r.arena)
}

// childWriter is an owner in a child process: it creates a region, tells the parent where its
// memfds are, and rewrites every generation until it is killed.
func childWriter() int {
	r, err := Create(Config{IndexSlots: 1024, ArenaBytes: 4 << 20, ReaderSlots: 64})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	if err := writeGeneration(r, 1); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	data, readers := r.Files()
	fmt.Println("READY", data.Fd(), readers.Fd())
	for gen := uint64(2); ; gen++ {
		err := writeGeneration(r, gen)
		for errors.Is(err, ErrRegionFull) {
			time.Sleep(100 * time.Microsecond)
			err = writeGeneration(r, gen)
		}
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
	}
}

// verifyGeneration checks, in one snapshot, that the region holds exactly one whole generation.
func verifyGeneration(r *Region) (uint64, error) {
	s, err := r.Snapshot()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	g, _, err := s.View(testKind, genKey)
	if err != nil {
		return 0, fmt.Errorf("generation marker: %w", err)
	}
	gen := binary.LittleEndian.Uint64(g)
	for i := 0; i < childKeys; i++ {
		v, _, err := s.View(testKind, childKey(i))
		deleted := i%7 == int(gen%7) && gen%3 == 0
		switch {
		case deleted && err == ErrNotFound:
			continue
		case err != nil:
			return gen, fmt.Errorf("%s at gen %d: %w", childKey(i), gen, err)
		}
		if vg, err := checkValue(childKey(i), v); err != nil || vg != gen {
			return gen, fmt.Errorf("%s has gen %d in a snapshot of gen %d: %v", childKey(i), vg, gen, err)
		}
	}
	vec, _, err := s.ViewFloat32(vectorKind, "vec")
	if err != nil || vec[0] != float32(gen) {
		return gen, fmt.Errorf("vector at gen %d: %v", gen, err)
	}
	return gen, s.Check()
}

// TestKillOwnerMidWrite SIGKILLs the owner at random points while it writes: whatever moment
// the kill lands, the region it leaves holds one whole generation, every value intact.
func TestKillOwnerMidWrite(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 4))
	for round := 0; round < 5; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), roleEnv+"=writer")
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		var dataFd, readersFd int
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		_, err = fmt.Sscanf(line, "READY %d %d", &dataFd, &readersFd)
		require.NoError(t, err, line)
		proc := fmt.Sprintf("/proc/%d/fd/", cmd.Process.Pid)
		data, err := os.Open(proc + strconv.Itoa(dataFd))
		require.NoError(t, err)
		readers, err := os.OpenFile(proc+strconv.Itoa(readersFd), os.O_RDWR, 0)
		require.NoError(t, err)
		r, err := Open(data, readers)
		require.NoError(t, err)
		data.Close()
		readers.Close()

		// Let the writer get past its first generations (a loaded machine may be slow to
		// schedule it), then kill it at a random point of its writing.
		require.Eventually(t, func() bool {
			gen, err := verifyGeneration(r)
			require.NoError(t, err)
			return gen > 2
		}, 20*time.Second, time.Millisecond, "the writer child writes")
		deadline := time.Now().Add(time.Duration(2+rng.IntN(40)) * time.Millisecond)
		for time.Now().Before(deadline) {
			_, err := verifyGeneration(r)
			require.NoError(t, err, "while the owner writes")
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		require.Error(t, cmd.Wait())
		gen, err := verifyGeneration(r)
		require.NoError(t, err, "after the owner was killed at generation %d", gen)
		require.Greater(t, gen, uint64(1), "the owner was killed while writing")
		require.NoError(t, r.Close())
	}
}
