//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const colValues = 16

func colKey(i int) string { return fmt.Sprintf("cv-%02d", i) }

// childColVerify pins snapshots until the generation marker reaches its stop value. In each,
// every column named by a value must hold exactly what that value wrote (someCells: the
// unwritten cells zero), no column may be named by two values, and the views must stay
// unchanged for as long as the snapshot is open, while the owner replaces, deletes and reuses.
func childColVerify(r *Region) int {
	stop, _ := strconv.ParseUint(os.Getenv("SHMSTEER_SHM_STOP"), 10, 64)
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 5))
	p := r.Columns()
	if c, n, b := p.Geometry(); c == 0 || n == 0 || b == 0 {
		fmt.Println("ERR no column pool in the opened region")
		return 1
	}
	fmt.Println("READY")
	snaps, checked := 0, 0
	for {
		s, err := r.Snapshot()
		if err != nil {
			fmt.Println("ERR snapshot:", err)
			return 1
		}
		var gen uint64
		if g, _, err := s.View(testKind, genKey); err == nil {
			gen = binary.LittleEndian.Uint64(g)
		}
		var views [][]byte
		owner := map[int]string{}
		fail := ""
		err = s.Range(colKind, func(key, v []byte, _ uint64) bool {
			_, cols, err := parseColValue(v)
			if err == nil {
				err = checkColumns(p, v, someCells)
			}
			if err != nil {
				fail = fmt.Sprintf("%s at version %d: %v", key, s.Version(), err)
				return false
			}
			for _, k := range cols {
				if o, ok := owner[k]; ok {
					fail = fmt.Sprintf("column %d named by %s and %s at version %d", k, o, key, s.Version())
					return false
				}
				owner[k] = string(key)
			}
			views = append(views, v)
			return true
		})
		if err != nil || fail != "" {
			fmt.Println("ERR", fail, err)
			return 1
		}
		time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond) // let the owner go on
		for _, v := range views {
			if err := checkColumns(p, v, someCells); err != nil {
				fmt.Printf("ERR while pinned at version %d: %v\n", s.Version(), err)
				return 1
			}
			checked++
		}
		s.Close()
		snaps++
		if gen >= stop {
			fmt.Printf("OK snaps=%d values=%d\n", snaps, checked)
			return 0
		}
	}
}

// TestMultiProcessColumns: the owner keeps replacing and deleting values that own columns
// (reusing the freed ones) while reader processes check, in every snapshot, that each column a
// visible value names holds that value's bytes and does not change while pinned. Two readers
// are SIGKILLed at random points, inside and outside snapshots; afterwards the owner has
// reclaimed every column their pins held and can reserve every column no live value names.
// The owner checks as it goes that it never hands out a column a live value names.
func TestMultiProcessColumns(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 1024, ArenaBytes: 4 << 20, ReaderSlots: 64, Columns: 64, ColumnCells: 6, CellBytes: 512})
	const stop = 300
	cmds, outs, drained := startColReaders(t, r, stop)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 6))
	killAt := []int{3 + rng.IntN(stop/2), 3 + rng.IntN(stop)}
	live := map[string][]int{}
	for gen := uint64(1); gen <= stop+30; gen++ {
		colGeneration(t, r, rng, live, gen)
		for i, at := range killAt {
			if at == int(gen) {
				require.NoError(t, cmds[3+i].Process.Signal(syscall.SIGKILL))
			}
		}
		if gen%16 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	for i, c := range cmds {
		err := c.Wait()
		<-drained[i]
		if i < 3 {
			require.NoError(t, err, "child %d: %s", i, outs[i].String())
			require.Contains(t, outs[i].String(), "OK", "child %d", i)
		} else {
			require.Error(t, err, "child %d was killed", i)
		}
	}
	for i := range cmds {
		require.NotContains(t, outs[i].String(), "ERR", "child %d", i)
	}

	named := 0
	for _, cols := range live {
		named += len(cols)
	}
	require.Eventually(t, func() bool {
		require.NoError(t, r.Reclaim())
		st := r.Stats()
		return st.ReadersClaimed == 0 && st.ColumnsRetired == 0
	}, 10*time.Second, 20*time.Millisecond)
	st := r.Stats()
	require.Equal(t, uint64(named), st.ColumnsUsed, "only live values' columns are taken: %+v", st)
	require.NotZero(t, st.DeadCleared, "the killed readers' slots were cleared")

	checkColumnsReservable(t, r, live, named)
	s, err := r.Snapshot()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Check())
	n := 0
	require.NoError(t, s.Range(colKind, func(key, v []byte, _ uint64) bool {
		_, cols, err := parseColValue(v)
		require.NoError(t, err)
		require.Equal(t, live[string(key)], cols)
		require.NoError(t, checkColumns(r.Columns(), v, someCells))
		n++
		return true
	}))
	require.Equal(t, len(live), n)
	t.Logf("readers: %s%s%sstats: %+v", outs[0], outs[1], outs[2], st)
}

// startColReaders starts five colverify readers: the first three stop after stop generations,
// the last two never (they are killed). outs[i] holds reader i's output once drained[i] is
// closed.
func startColReaders(t *testing.T, r *Region, stop int) ([]*exec.Cmd, []*strings.Builder, []chan struct{}) {
	t.Helper()
	cmds := startChildren(t, r, "colverify", 5)
	outs := make([]*strings.Builder, len(cmds))
	drained := make([]chan struct{}, len(cmds)) // closed when a child's stdout ends: outs[i] is whole
	for i, c := range cmds {
		st := strconv.Itoa(stop)
		if i >= 3 {
			st = strconv.Itoa(1 << 40) // killed before it stops
		}
		c.Env = append(c.Env, "SHMSTEER_SHM_STOP="+st)
		outs[i] = &strings.Builder{}
		pr, pw, err := os.Pipe()
		require.NoError(t, err)
		c.Stdout = pw
		require.NoError(t, c.Start())
		pw.Close()
		line := make([]byte, 6)
		_, err = pr.Read(line)
		require.NoError(t, err)
		require.Equal(t, "READY\n", string(line), "child %d", i)
		drained[i] = make(chan struct{})
		go func(b *strings.Builder, done chan struct{}) {
			defer close(done)
			defer pr.Close()
			buf := make([]byte, 4096)
			for {
				n, err := pr.Read(buf)
				b.Write(buf[:n])
				if err != nil {
					return
				}
			}
		}(outs[i], drained[i])
	}
	return cmds, outs, drained
}

// colGeneration writes generation gen: one to four random values replaced (their columns
// checked against every live value's) or deleted, and the generation key, retrying while the
// pool or the region is full; live is updated to match.
func colGeneration(t *testing.T, r *Region, rng *rand.Rand, live map[string][]int, gen uint64) {
	t.Helper()
	var wrote map[string][]int
	var deleted []string
	write := func(tx *Tx) error {
		wrote, deleted = map[string][]int{}, nil
		for range 1 + rng.IntN(4) {
			key := colKey(rng.IntN(colValues))
			if _, ok := wrote[key]; ok || slices.Contains(deleted, key) {
				continue
			}
			if _, ok := live[key]; ok && rng.IntN(4) == 0 {
				if err := tx.Delete(colKind, key); err != nil {
					return err
				}
				deleted = append(deleted, key)
				continue
			}
			cols, err := writeColumns(tx, key, 1+rng.IntN(2), gen<<8|uint64(rng.IntN(256)), someCells)
			if err != nil {
				return err
			}
			for _, k := range cols {
				for o, lc := range live {
					require.NotContains(t, lc, k, "gen %d: AllocColumn handed out column %d, which %s names", gen, k, o)
				}
			}
			wrote[key] = cols
		}
		var g [8]byte
		binary.LittleEndian.PutUint64(g[:], gen)
		return tx.Put(testKind, genKey, g[:])
	}
	// Readers pinning old versions hold retired columns back; a full pool waits for them
	// to move on (or for a killed reader's slot to be cleared), as an owner would.
	require.Eventually(t, func() bool {
		_, err := r.Update(write)
		if errors.Is(err, ErrColumnsFull) || errors.Is(err, ErrRegionFull) {
			time.Sleep(100 * time.Microsecond)
			return false
		}
		require.NoError(t, err)
		return true
	}, 20*time.Second, time.Microsecond)
	for k, cols := range wrote {
		live[k] = cols
	}
	for _, k := range deleted {
		delete(live, k)
	}
}

// checkColumnsReservable checks that every column no live value names (named are) can be
// reserved again, zeroed, and no more.
func checkColumnsReservable(t *testing.T, r *Region, live map[string][]int, named int) {
	t.Helper()
	_, err := r.Update(func(tx *Tx) error {
		for range 64 - named {
			k, err := tx.AllocColumn()
			require.NoError(t, err)
			for o, lc := range live {
				require.NotContains(t, lc, k, "column %d of %s handed out", k, o)
			}
			for c := range 6 {
				dst, err := tx.Cell(k, c)
				require.NoError(t, err)
				require.Equal(t, make([]byte, 512), dst, "column %d cell %d handed out zeroed", k, c)
			}
		}
		_, err := tx.AllocColumn()
		require.ErrorIs(t, err, ErrColumnsFull)
		return err
	})
	require.ErrorIs(t, err, ErrColumnsFull)
}
