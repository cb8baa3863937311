//go:build linux

package capture

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// genRecord is record seq of a deterministic stream: its request id, and a record whose every
// byte is a function of seq, so a reader can check a record it sees bitwise.
func genRecord(seq uint64, maxWidth int) (string, Record) {
	rng := rand.New(rand.NewPCG(seq, 7))
	d := []Dtype{Float32, BFloat16, Float16}[seq%3]
	rows := 1 + int(seq%5)
	width := 1 + rng.IntN(maxWidth)
	r := Record{Layer: int(seq % 7), Hook: []string{"pre_attn", "post_block", "mlp_out"}[seq%3], Dtype: d, Rows: rows, Width: width}
	for i := range rows {
		r.Positions = append(r.Positions, int(seq)+i)
	}
	r.Data = make([]byte, rows*width*d.Size())
	for i := range r.Data {
		r.Data[i] = byte(rng.Uint32())
	}
	return "req-" + strconv.FormatUint(seq, 10), r
}

func checkGen(t *testing.T, got RingRecord, maxWidth int) uint64 {
	t.Helper()
	seq, err := strconv.ParseUint(strings.TrimPrefix(got.RequestID, "req-"), 10, 64)
	if err != nil {
		t.Fatalf("request id %q", got.RequestID)
	}
	id, want := genRecord(seq, maxWidth)
	if got.RequestID != id || got.Layer != want.Layer || got.Hook != want.Hook || got.Dtype != want.Dtype ||
		got.Rows != want.Rows || got.Width != want.Width || !slices.Equal(got.Positions, want.Positions) || !bytes.Equal(got.Data, want.Data) {
		t.Fatalf("record %d torn or wrong: layer %d hook %q %s %dx%d positions %v, data equal %v", seq, got.Layer, got.Hook,
			got.Dtype, got.Rows, got.Width, got.Positions, bytes.Equal(got.Data, want.Data))
	}
	return seq
}

func newRing(t *testing.T, capacity uint64, slots int) *Ring {
	t.Helper()
	r, err := CreateRing(capacity, slots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// Records round-trip bitwise through many wraps (pad frames), interleaved with reads.
func TestRingRoundTrip(t *testing.T) {
	r := newRing(t, 8192, 2)
	c, err := r.Attach(Block)
	if err != nil {
		t.Fatal(err)
	}
	w := r.Writer(time.Second)
	var next uint64
	for seq := range uint64(2000) {
		id, rec := genRecord(seq, 64)
		if err := w.Append(id, rec); err != nil {
			t.Fatal(seq, err)
		}
		if seq%3 == 2 { // read in bursts
			for {
				got, ok, err := c.Next()
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				if s := checkGen(t, got, 64); s != next {
					t.Fatalf("read record %d, want %d", s, next)
				}
				next++
			}
		}
	}
	c.Release()
	st := r.Stats()
	if st.Records != 2000 || st.Dropped != 0 || c.Received() != next || next < 1998 {
		t.Fatalf("stats %+v, received %d, read %d", st, c.Received(), next)
	}
}

// A consumer that never reads: Block waits its bound, then drops; Drop drops at once; both
// are counted in the ring and in the lagging slot only, and what was written stays whole.
func TestRingBackpressure(t *testing.T) {
	for _, p := range []Policy{Block, Drop} {
		t.Run(fmt.Sprint(p), func(t *testing.T) {
			r := newRing(t, 4096, 2)
			stuck, err := r.Attach(p)
			if err != nil {
				t.Fatal(err)
			}
			w := r.Writer(2 * time.Millisecond)
			var written uint64
			var dropErr error
			for seq := range uint64(100) {
				id, rec := genRecord(seq, 16)
				if err := w.Append(id, rec); err != nil {
					dropErr = err
					break
				}
				written++
			}
			if !errors.Is(dropErr, ErrDropped) || written == 0 {
				t.Fatalf("after %d records: %v, want ErrDropped", written, dropErr)
			}
			if st := r.Stats(); st.Dropped != 1 || stuck.Dropped() != 1 || st.Records != written || st.Occupancy == 0 {
				t.Fatalf("stats %+v, slot dropped %d", st, stuck.Dropped())
			}
			// A second consumer attaching now lags nobody's records; the stuck one still
			// reads every record written, whole and in order.
			for seq := range written {
				got, ok, err := stuck.Next()
				if err != nil || !ok {
					t.Fatalf("record %d: %v %v", seq, ok, err)
				}
				if s := checkGen(t, got, 16); s != seq {
					t.Fatalf("read %d, want %d", s, seq)
				}
			}
			if _, ok, err := stuck.Next(); ok || err != nil {
				t.Fatalf("past the end: %v %v", ok, err)
			}
			// Detached, it no longer holds the writer back.
			stuck.Detach()
			for seq := range uint64(200) {
				id, rec := genRecord(seq, 16)
				if err := w.Append(id, rec); err != nil {
					t.Fatalf("after Detach: %v", err)
				}
			}
		})
	}
}

// With a reading Block consumer and a stuck Drop consumer the drop is counted on the stuck
// slot only, and the reading consumer loses exactly the dropped records.
func TestRingDropCountedPerConsumer(t *testing.T) {
	r := newRing(t, 4096, 2)
	reader, _ := r.Attach(Block)
	stuck, _ := r.Attach(Drop)
	w := r.Writer(time.Second)
	drops := 0
	for seq := range uint64(300) {
		id, rec := genRecord(seq, 16)
		if err := w.Append(id, rec); errors.Is(err, ErrDropped) {
			drops++
		} else if err != nil {
			t.Fatal(err)
		}
		for {
			_, ok, err := reader.Next()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
		}
	}
	if drops == 0 || stuck.Dropped() != uint64(drops) || reader.Dropped() != 0 || reader.Received() != uint64(300-drops) {
		t.Fatalf("drops %d, stuck %d, reader dropped %d received %d", drops, stuck.Dropped(), reader.Dropped(), reader.Received())
	}
}

func TestRingErrors(t *testing.T) {
	r := newRing(t, 4096, 1)
	w := r.Writer(0)
	id, rec := genRecord(1, 16)
	if err := w.Append(id, rec); err != nil || r.Stats().Records != 0 {
		t.Fatalf("no consumer: %v, %+v (want nothing written)", err, r.Stats())
	}
	c, err := r.Attach(Drop)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Attach(Drop); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("second attach: %v", err)
	}
	if _, err := r.Attach(Policy(9)); !errors.Is(err, ErrBadPolicy) {
		t.Fatalf("bad policy: %v", err)
	}
	big := Record{Layer: 0, Hook: "post_block", Dtype: Float32, Rows: 1, Width: 600, Data: make([]byte, 2400), Positions: []int{0}}
	if err := w.Append("r", big); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("big: %v", err)
	}
	if err := w.Append("", rec); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("empty id: %v", err)
	}
	rec.Positions[0] = -1
	if err := w.Append("r", rec); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("negative position: %v", err)
	}
	if _, ok, err := c.Next(); ok || err != nil {
		t.Fatalf("nothing valid was written: %v %v", ok, err)
	}
	if _, err := CreateRing(100, 1); !errors.Is(err, ErrRingLayout) {
		t.Fatalf("tiny ring: %v", err)
	}
	// A memfd that is not a ring, and one whose header lies about its size.
	fd, err := unix.MemfdCreate("not-a-ring", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, 1<<16)
	if _, err := OpenRing(fd); !errors.Is(err, ErrRingLayout) {
		t.Fatalf("zero memfd: %v", err)
	}
	copy(r.mem[8:16], []byte{0, 0, 1, 0, 0, 0, 0, 0}) // capacity 65536 in a 4 KiB ring
	if _, err := OpenRing(r.Fd()); !errors.Is(err, ErrRingLayout) {
		t.Fatalf("lying header: %v", err)
	}
	copy(r.mem[8:16], []byte{0, 16, 0, 0, 0, 0, 0, 0})
	o, err := OpenRing(r.Fd())
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	o.Close()
}

// ringFile is a dup of the ring's descriptor for cmd.ExtraFiles: an *os.File of the ring's own
// fd would close it when collected.
func ringFile(t *testing.T, r *Ring) *os.File {
	t.Helper()
	fd, err := unix.Dup(r.Fd())
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "ring")
	t.Cleanup(func() { f.Close() })
	return f
}

const (
	ringChildEnv     = "SHMSTEER_CAPTURE_RING_CHILD"
	consumerChildEnv = "SHMSTEER_CAPTURE_RING_CONSUMER"
)

// The ring writer of TestRingWriterKilled, in a child: appends the deterministic stream to
// the ring on fd 3 until killed.
func TestMain(m *testing.M) {
	if os.Getenv(rankChildEnv) != "" {
		rankChild() // rank_multiproc_test.go
	}
	if os.Getenv(hubConsumerChildEnv) != "" {
		hubConsumerChild()
	}
	if os.Getenv(hostileWorkerChildEnv) != "" {
		hostileWorkerChild() // hostile_test.go
	}
	if os.Getenv(followChildEnv) != "" {
		followChild() // follow_test.go
	}
	if os.Getenv(consumerChildEnv) != "" {
		// TestRingDeadConsumerReclaimed's consumer: attach, say so, never read.
		r, err := OpenRing(3)
		if err == nil {
			_, err = r.Attach(Block)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println("attached")
		select {}
	}
	if os.Getenv(ringChildEnv) != "" {
		r, err := OpenRing(3)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		w := r.Writer(10 * time.Second)
		for seq := uint64(0); ; seq++ {
			id, rec := genRecord(seq, 8192)
			if err := w.Append(id, rec); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
		}
	}
	os.Exit(m.Run())
}

// A writer process SIGKILLed at random points, mid-record among them: the reader sees every
// record published before the kill, in order and bitwise whole, and never a torn one.
func TestRingWriterKilled(t *testing.T) {
	for round := range 4 {
		r := newRing(t, 1<<20, 1)
		c, err := r.Attach(Block)
		if err != nil {
			t.Fatal(err)
		}
		f := ringFile(t, r)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), ringChildEnv+"=1")
		cmd.ExtraFiles = []*os.File{f}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var next uint64
		read := func() {
			for {
				got, ok, err := c.Next()
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					return
				}
				if s := checkGen(t, got, 8192); s != next {
					t.Fatalf("read record %d, want %d", s, next)
				}
				next++
			}
		}
		// Kill once the writer is streaming, after a random number of records and a random
		// delay, so the kill lands anywhere in a frame's write.
		start, warm := time.Now(), uint64(20+rand.IntN(200))
		for next < warm {
			if time.Since(start) > 20*time.Second {
				t.Fatalf("the writer child wrote %d records in 20 s: %s", next, stderr.String())
			}
			read()
		}
		for killAt := time.Now().Add(time.Duration(rand.IntN(3000)) * time.Microsecond); time.Now().Before(killAt); {
			read()
		}
		cmd.Process.Signal(syscall.SIGKILL)
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("writer ended by itself: %v, %s", err, stderr.String())
		}
		read()
		// The writer counts a record right after publishing it (RingStats), so a kill between
		// the two leaves Records one short of the records read: never more than one (no Hold
		// here), and never above them.
		st := r.Stats()
		if (st.Records != next && st.Records+1 != next) || st.Dropped != 0 || next < warm {
			t.Fatalf("round %d: the writer counted %d records, the reader read %d (%+v)", round, st.Records, next, st)
		}
		t.Logf("round %d: %d records read before and after the kill, %d counted", round, next, st.Records)
	}
}

// A consumer process that attaches with Block and never reads holds the writer back (each
// lagging Append waits its bound, then drops); SIGKILLed, its slot is reclaimed and the live
// consumer receives every later record.
func TestRingDeadConsumerReclaimed(t *testing.T) {
	r := newRing(t, 16<<10, 2)
	live, err := r.Attach(Block)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), consumerChildEnv+"=1")
	cmd.ExtraFiles = []*os.File{ringFile(t, r)}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line := make([]byte, 9)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "attached\n" {
		t.Fatalf("consumer child: %q, %v", line, err)
	}
	w := r.Writer(5 * time.Millisecond)
	drain := func() {
		for {
			if _, ok, err := live.Next(); err != nil {
				t.Fatal(err)
			} else if !ok {
				return
			}
		}
	}
	seq := uint64(0)
	for ; r.Stats().Dropped == 0 && seq < 1000; seq++ {
		id, rec := genRecord(seq, 64)
		w.Append(id, rec)
		drain()
	}
	if r.Stats().Dropped == 0 {
		t.Fatal("a live consumer that never reads never held the writer back")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	before, got := r.Stats().Dropped, live.Received()
	for i := range uint64(500) {
		id, rec := genRecord(seq+i, 64)
		if err := w.Append(id, rec); err != nil {
			t.Fatalf("after the consumer died: %v", err)
		}
		drain()
	}
	if st := r.Stats(); st.Dropped != before || st.Reclaimed != 1 || live.Received()-got != 500 {
		t.Fatalf("stats %+v (dropped before %d), live received %d of 500", st, before, live.Received()-got)
	}
}

// A writer goroutine and a reader goroutine at once (run under -race in CI): every record
// arrives whole, in order, none dropped.
func TestRingConcurrentReader(t *testing.T) {
	r := newRing(t, 32<<10, 1)
	c, err := r.Attach(Block)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	errc := make(chan error, 1)
	go func() {
		w := r.Writer(10 * time.Second)
		for seq := range uint64(n) {
			id, rec := genRecord(seq, 200)
			if err := w.Append(id, rec); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	deadline := time.Now().Add(time.Minute)
	for next := uint64(0); next < n; {
		got, ok, err := c.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if time.Now().After(deadline) {
				t.Fatalf("read %d of %d records in a minute", next, n)
			}
			time.Sleep(10 * time.Microsecond)
			continue
		}
		if s := checkGen(t, got, 200); s != next {
			t.Fatalf("read %d, want %d", s, next)
		}
		next++
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Dropped != 0 || st.Records != n {
		t.Fatalf("stats %+v", st)
	}
}
