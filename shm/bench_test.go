//go:build linux

package shm

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The benchmark key set: 1024 request ids of 36 characters (UUID-shaped) with 32-byte values,
// the shape of the key registry's hot path.
const benchKeys = 1024

func benchKey(i int) string {
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", i*2654435761, i&0xffff, i&0xfff, (i*7)&0xfff, i*7919)
}

func benchRegion(b *testing.B) *Region {
	r := newTestRegion(b, Config{IndexSlots: 4096, ArenaBytes: 4 << 20})
	_, err := r.Update(func(tx *Tx) error {
		for i := 0; i < benchKeys; i++ {
			if err := tx.Put(1, benchKey(i), []byte(strings.Repeat(string(rune('a'+i%26)), 32))); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(b, err)
	return r
}

// childGetLoop is the bench-get child: it times n Reader.Gets of the benchmark keys and prints
// ns/op, so the parent reports a figure measured in another process.
func childGetLoop(r *Region, n int) int {
	rd, err := r.NewReader()
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	defer rd.Close()
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	buf := make([]byte, 0, 64)
	for i := 0; i < benchKeys; i++ { // warm up
		buf, _ = rd.Get(1, keys[i], buf[:0])
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		if buf, err = rd.Get(1, keys[i&(benchKeys-1)], buf[:0]); err != nil || len(buf) != 32 {
			fmt.Println("ERR get", err)
			return 1
		}
	}
	fmt.Println(float64(time.Since(start).Nanoseconds()) / float64(n))
	return 0
}

// BenchmarkGet compares a Get of a 32-byte value under a 36-character key with a Go map lookup
// of the same keys (the floor), in process and from a child process.
func BenchmarkGet(b *testing.B) {
	r := benchRegion(b)
	// The ids looked up are separate allocations from the ids stored, as in a server where the
	// id arrives with each request: otherwise the map's key compare short-cuts on pointer
	// equality and never reads the bytes.
	keys := make([]string, benchKeys)
	m := make(map[string][]byte, benchKeys)
	for i := range keys {
		keys[i] = benchKey(i)
		m[strings.Clone(keys[i])], _ = r.Get(1, keys[i], nil)
	}
	buf := make([]byte, 0, 64)
	b.Run("gomap", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			buf = append(buf[:0], m[keys[i&(benchKeys-1)]]...)
		}
	})
	b.Run("reader", func(b *testing.B) {
		rd, err := r.NewReader()
		require.NoError(b, err)
		defer rd.Close()
		for i := 0; b.Loop(); i++ {
			buf, _ = rd.Get(1, keys[i&(benchKeys-1)], buf[:0])
		}
	})
	b.Run("region", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			buf, _ = r.Get(1, keys[i&(benchKeys-1)], buf[:0])
		}
	})
	b.Run("miss", func(b *testing.B) {
		rd, err := r.NewReader()
		require.NoError(b, err)
		defer rd.Close()
		missing := make([]string, benchKeys)
		for i := range missing {
			missing[i] = benchKey(i + benchKeys)
		}
		for i := 0; b.Loop(); i++ {
			_, err = rd.Get(1, missing[i&(benchKeys-1)], buf[:0])
		}
		require.ErrorIs(b, err, ErrNotFound)
	})
	b.Run("child", func(b *testing.B) {
		data, readers := r.Files()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), roleEnv+"=bench-get", "SHMSTEER_SHM_N="+strconv.Itoa(max(b.N, 1)))
		cmd.ExtraFiles = []*os.File{data, readers}
		out, err := cmd.Output()
		require.NoError(b, err, string(out))
		ns, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		require.NoError(b, err, string(out))
		b.ReportMetric(ns, "child-ns/op")
	})
}

// BenchmarkPut is the owner's write path: one transaction replacing a 32-byte value.
func BenchmarkPut(b *testing.B) {
	r := benchRegion(b)
	val := []byte(strings.Repeat("z", 32))
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	for i := 0; b.Loop(); i++ {
		if _, err := r.Put(1, keys[i&(benchKeys-1)], val); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkColumnCell is the cost of one CellFloat32 lookup, the decode step's per-request,
// per-site call (64 columns of 160 cells; 64-byte cells, so the figure is the call's, not the
// memory's).
func BenchmarkColumnCell(b *testing.B) {
	r := newTestRegion(b, Config{IndexSlots: 64, ArenaBytes: 64 << 10, ReaderSlots: 2, Columns: 64, ColumnCells: 160, CellBytes: 64})
	p := r.Columns()
	var sum float32
	b.ReportAllocs()
	col, cell := 0, 0
	for b.Loop() {
		sum += p.CellFloat32(col, cell)[0]
		if col++; col == 64 {
			col = 0
			if cell++; cell == 160 {
				cell = 0
			}
		}
	}
	_ = sum
}
