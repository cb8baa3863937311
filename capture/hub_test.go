//go:build linux

package capture

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// hubEnv is an owner with a hub declaring consumers "fs" and "other", in this process.
type hubEnv struct {
	secret ipc.Secret
	file   string // the secret, in a file (for children)
	ns     string
	owner  *ipc.Owner
	hub    *Hub
}

func newHubEnv(t testing.TB) *hubEnv {
	t.Helper()
	raw := rand.Text()
	e := &hubEnv{secret: ipc.NewSecret([]byte(raw)), ns: "capture-test-" + rand.Text()[:12], file: filepath.Join(t.TempDir(), "secret")}
	if err := os.WriteFile(e.file, []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	e.owner, err = ipc.NewOwner(ipc.OwnerOptions{Secret: &e.secret, Namespace: e.ns, Region: shm.Config{IndexSlots: 64, ArenaBytes: 1 << 16},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e.hub, err = NewHub(HubOptions{Consumers: map[string]string{"fs": "filesystem", "other": "filesystem"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e.hub.Serve(func(op uint16, h func([]byte) ([]byte, error)) { e.owner.Handle(op, h) })
	t.Cleanup(func() { e.hub.Close(); e.owner.Close() })
	return e
}

func (e *hubEnv) client(t testing.TB) *ipc.Client {
	t.Helper()
	c, err := ipc.Attach(ipc.ClientOptions{Secret: &e.secret, Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (e *hubEnv) worker(t testing.TB, opts WorkerOptions) *Worker {
	t.Helper()
	w, err := RegisterWorker(e.client(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func (e *hubEnv) consumer(t testing.TB, opts ConsumerOptions) *Consumer {
	t.Helper()
	c, err := NewConsumer(e.client(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func next(t *testing.T, c *Consumer) Event {
	t.Helper()
	ev, ok, err := c.Next(5 * time.Second)
	if err != nil || !ok {
		t.Fatalf("Next: ok %v, %v", ok, err)
	}
	return ev
}

// The whole path in one process: a worker registers its ring, a consumer attaches and gets it,
// a second worker registers later and the consumer gets its ring too; a captured request's
// begin comes before its records (bitwise what the worker appended), an uncaptured request's
// records are skipped, the end comes after every record of the request, and the result the
// consumer publishes is the owner's result.
func TestHubEndToEnd(t *testing.T) {
	e := newHubEnv(t)
	w1 := e.worker(t, WorkerOptions{Capacity: 1 << 20})
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	w2 := registerLaterWorker(t, e, c)

	if res, ended := e.hub.Result("r1"); ended || res["fs"].Status != StatusNotRequested {
		t.Fatalf("before admission: %v ended %v", res, ended)
	}
	spec := json.RawMessage(`{"tag":"t","hooks":{"post_block":"all"}}`)
	e.hub.Begin("r1", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": spec}, PromptLen: 7})
	if res, _ := e.hub.Result("r1"); res["fs"].Status != StatusPending || res["other"].Status != StatusNotRequested {
		t.Fatalf("after admission: %v", res)
	}
	var want []Record
	for seq := range uint64(20) {
		_, rec := genRecord(seq, 256)
		w := w1
		if seq%2 == 1 {
			w = w2
		}
		if err := w.Writer().Append("r1", rec); err != nil {
			t.Fatal(err)
		}
		want = append(want, rec)
		if _, other := genRecord(seq+1000, 64); true {
			if err := w.Writer().Append("r2", other); err != nil { // not captured for fs
				t.Fatal(err)
			}
		}
	}
	e.hub.End("r1")

	if ev := next(t, c); ev.Kind != EventBegin || ev.RequestID != "r1" || !bytes.Equal(ev.Spec, spec) || ev.PromptLen != 7 {
		t.Fatalf("first event %+v", ev)
	}
	got, rings := readUntilEnd(t, c, "r1")
	if len(got) != len(want) || len(rings) != 2 {
		t.Fatalf("%d records from %d rings, want %d from 2", len(got), len(rings), len(want))
	}
	// Per ring the order is the append order; across rings it interleaves.
	for _, g := range got {
		if !slices.ContainsFunc(want, func(w Record) bool {
			return w.Layer == g.Layer && w.Hook == g.Hook && slices.Equal(w.Positions, g.Positions) && bytes.Equal(w.Data, g.Data)
		}) {
			t.Fatalf("record %d/%s not appended", g.Layer, g.Hook)
		}
	}
	if st := c.Stats(); st.Skipped != 20 || st.Received != 40 || st.Rings != 2 {
		t.Fatalf("consumer stats %+v", st)
	}
	if err := c.Publish("r1", Result{Status: StatusOK, Payload: json.RawMessage(`["/a","/b"]`)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the result", func() bool { r, _ := e.hub.Result("r1"); return r["fs"].Status == StatusOK })
	res, ended := e.hub.Result("r1")
	b, _ := json.Marshal(res)
	if !ended || string(b) != `{"fs":{"status":"ok","error":null,"payload":["/a","/b"]},"other":{"status":"not_requested","error":null,"payload":[]}}` {
		t.Fatalf("result %s ended %v", b, ended)
	}
	st := e.hub.Status()
	if len(st.Rings) != 2 || st.Rings[0].Records != 20 || len(st.Consumers) != 2 || !st.Consumers[0].Attached || st.Consumers[0].Received != 40 {
		t.Fatalf("hub status %+v", st)
	}

	// A worker that leaves: its ring goes from the consumer too.
	w2.Close()
	waitFor(t, "the ring to go", func() bool {
		c.Next(time.Millisecond)
		return c.Stats().Rings == 1 && len(e.hub.Status().Rings) == 1
	})
}

// registerLaterWorker registers a second worker while the consumer c reads (and sees no event),
// and checks that the registration returns once c has a slot on the new ring.
func registerLaterWorker(t *testing.T, e *hubEnv, c *Consumer) *Worker {
	t.Helper()
	reg := make(chan error, 1)
	cl2 := e.client(t)
	var w2 *Worker
	go func() {
		var err error
		w2, err = RegisterWorker(cl2, WorkerOptions{Capacity: 1 << 20})
		reg <- err
	}()
	for done := false; !done; {
		if _, ok, err := c.Next(time.Millisecond); ok || err != nil {
			t.Fatalf("an event before any admission (%v)", err)
		}
		select {
		case err := <-reg:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		default:
		}
	}
	if n := e.hub.Status().Consumers[0].Rings; n != 2 {
		t.Fatalf("the consumer reads %d rings after the second registration", n)
	}
	return w2
}

// readUntilEnd reads request id's records up to its end (which must report nothing dropped),
// copying each, and counts them per ring.
func readUntilEnd(t *testing.T, c *Consumer, id string) ([]Record, map[uint32]int) {
	t.Helper()
	var got []Record
	rings := map[uint32]int{}
	for {
		ev := next(t, c)
		if ev.Kind == EventEnd {
			if ev.RequestID != id || ev.Dropped != 0 {
				t.Fatalf("end %+v", ev)
			}
			break
		}
		if ev.Kind != EventRecord || ev.RequestID != id {
			t.Fatalf("event %+v", ev)
		}
		r := ev.Record.Record
		r.Data = slices.Clone(r.Data)
		got = append(got, r)
		rings[ev.Ring]++
	}
	return got, rings
}

// Attaching names a declared consumer, once at a time; bad input is typed.
func TestHubAttachRefusals(t *testing.T) {
	e := newHubEnv(t)
	cl := e.client(t)
	if _, err := NewConsumer(cl, ConsumerOptions{Name: "nope"}); !errors.Is(err, ErrUnknownConsumer) {
		t.Fatalf("undeclared: %v", err)
	}
	if _, err := NewConsumer(cl, ConsumerOptions{Name: "fs", Policy: 7}); !errors.Is(err, ErrBadPolicy) {
		t.Fatalf("policy: %v", err)
	}
	if _, err := NewConsumer(cl, ConsumerOptions{Name: "fs", Bound: -1}); !errors.Is(err, ErrBadPolicy) {
		t.Fatalf("bound: %v", err)
	}
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	if _, err := NewConsumer(cl, ConsumerOptions{Name: "fs"}); !errors.Is(err, ErrConsumerTaken) {
		t.Fatalf("second fs: %v", err)
	}
	if err := c.Publish("r", Result{Status: StatusPending}); !errors.Is(err, ErrBadResult) {
		t.Fatalf("pending result: %v", err)
	}
	if err := c.Publish("r", Result{Status: StatusOK, Payload: json.RawMessage(`{}`)}); !errors.Is(err, ErrBadResult) {
		t.Fatalf("object payload: %v", err)
	}
	c.Close()
	waitFor(t, "the name to free", func() bool { return !e.hub.Status().Consumers[0].Attached })
	e.consumer(t, ConsumerOptions{Name: "fs"})

	// An owner without a hub.
	secret := ipc.NewSecret([]byte(rand.Text()))
	ns := "capture-nohub-" + rand.Text()[:12]
	o, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: ns, Region: shm.Config{IndexSlots: 64, ArenaBytes: 1 << 16}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	bare, err := ipc.Attach(ipc.ClientOptions{Secret: &secret, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if _, err := RegisterWorker(bare, WorkerOptions{}); !errors.Is(err, ErrNoHub) {
		t.Fatalf("no hub: %v", err)
	}
}

// A request admitted while its consumer is not attached ends with status error at once, and a
// consumer that closes before publishing turns its pending requests to error.
func TestHubConsumerAbsentOrGone(t *testing.T) {
	e := newHubEnv(t)
	e.hub.Begin("early", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
	if r, _ := e.hub.Result("early"); r["fs"].Status != StatusError || !strings.Contains(r["fs"].Error, "not attached") {
		t.Fatalf("absent consumer: %+v", r["fs"])
	}
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	e.hub.Begin("r", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`), "other": json.RawMessage(`{}`)}, PromptLen: 1})
	if ev := next(t, c); ev.Kind != EventBegin {
		t.Fatalf("%+v", ev)
	}
	c.Close()
	waitFor(t, "status error", func() bool { r, _ := e.hub.Result("r"); return r["fs"].Status == StatusError })
	if r, _ := e.hub.Result("r"); r["other"].Status != StatusError {
		t.Fatalf("other: %+v", r["other"])
	}
}

const hubConsumerChildEnv = "SHMSTEER_CAPTURE_HUB_CONSUMER_CHILD"

// hubConsumerChild attaches as consumer "fs" (Block, bound 30 s) to the owner named in its
// environment, reads the begin notice it is sent, then never reads again.
func hubConsumerChild() {
	c, err := AttachConsumer(ConsumerOptions{Name: "fs", Bound: 30 * time.Second, Namespace: os.Getenv("SHMSTEER_TEST_NS"), SecretFile: os.Getenv("SHMSTEER_TEST_SECRET_FILE")})
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(2)
	}
	os.Stdout.WriteString("attached " + strconv.Itoa(os.Getpid()) + "\n")
	for {
		if ev, ok, err := c.Next(time.Second); err != nil {
			os.Exit(3)
		} else if ok && ev.Kind == EventBegin {
			os.Stdout.WriteString("begun " + ev.RequestID + "\n")
			select {}
		}
	}
}

// A consumer process SIGKILLed mid-request: the owner frees its ring slot (so the writer, whose
// bound is long, is not held back: the ring fills and wraps with no drop) and its request ends
// with status error. Also with the consumer in a PID namespace of its own (where it is pid 1):
// its slot records its peer-credential pid as the owner's namespace sees it.
func TestHubConsumerKilled(t *testing.T) {
	t.Run("same-pid-namespace", func(t *testing.T) { hubConsumerKilled(t, false) })
	t.Run("own-pid-namespace", func(t *testing.T) {
		probe := exec.Command("/bin/true")
		probe.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
		if err := probe.Run(); err != nil {
			t.Skipf("skipped: cannot start a process in a new PID namespace here (%v): needs root or user namespaces", err)
		}
		hubConsumerKilled(t, true)
	})
}

func hubConsumerKilled(t *testing.T, newNS bool) {
	e := newHubEnv(t)
	w := e.worker(t, WorkerOptions{Capacity: 64 << 10, Wait: time.Minute})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hubConsumerChildEnv+"=1", "SHMSTEER_TEST_SECRET_FILE="+e.file, "SHMSTEER_TEST_NS="+e.ns)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if newNS {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "attached ") {
		t.Fatalf("child: %q", lines.Text())
	}
	if ownPid := strings.TrimPrefix(lines.Text(), "attached "); newNS != (ownPid == "1") {
		t.Fatalf("the child sees itself as pid %s (new PID namespace: %v)", ownPid, newNS)
	}
	e.hub.Begin("r1", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 4})
	if !lines.Scan() || lines.Text() != "begun r1" {
		t.Fatalf("child: %q", lines.Text())
	}
	waitFor(t, "the child's slot", func() bool { return e.hub.Status().Consumers[0].Rings == 1 })
	// Mid-request: some records in, the child reads none of them.
	for seq := range uint64(8) {
		_, rec := genRecord(seq, 256)
		if err := w.Writer().Append("r1", rec); err != nil {
			t.Fatal(err)
		}
	}
	if lag := e.hub.Status().Consumers[0].Lag; lag == 0 {
		t.Fatal("the child's slot shows no lag")
	}
	// The slot records the consumer's pid in the owner's (and this worker's) namespace.
	var pids []int
	for _, s := range w.Ring().Slots() {
		if s.Attached {
			pids = append(pids, s.PID)
		}
	}
	if len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Fatalf("attached slots record pids %v, the child is %d", pids, cmd.Process.Pid)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	waitFor(t, "status error", func() bool { r, _ := e.hub.Result("r1"); return r["fs"].Status == StatusError })
	st := e.hub.Status()
	if st.Consumers[0].Attached || st.Rings[0].Reclaimed != 1 {
		t.Fatalf("after the kill: %+v", st)
	}
	// The ring's 64 KiB wraps many times over with no wait for the dead slot and no drop
	// (no consumer is attached, so nothing is written either: Append returns at once).
	for seq := range uint64(2000) {
		_, rec := genRecord(seq, 256)
		if err := w.Writer().Append("r1", rec); err != nil {
			t.Fatal(seq, err)
		}
	}
	if st := w.Ring().Stats(); st.Dropped != 0 {
		t.Fatalf("dropped %d after the consumer died", st.Dropped)
	}
	e.hub.End("r1")
	if r, _ := e.hub.Result("r1"); r["fs"].Status != StatusError || !strings.Contains(r["fs"].Error, "left before publishing") {
		t.Fatalf("result %+v", r["fs"])
	}
}

// A consumer that never reads: with Block and its own short bound a full ring makes each
// append wait at most that bound (not the worker's minute) and drop, counted in the ring, the
// consumer and the owner's status; with Drop the append drops at once.
func TestHubConsumerNeverReads(t *testing.T) {
	for _, p := range []Policy{Block, Drop} {
		e := newHubEnv(t)
		w := e.worker(t, WorkerOptions{Capacity: 16 << 10, Wait: time.Minute})
		c := e.consumer(t, ConsumerOptions{Name: "fs", Policy: p, Bound: 5 * time.Millisecond})
		waitFor(t, "the slot", func() bool { return e.hub.Status().Consumers[0].Rings == 1 })
		start := time.Now()
		written, dropped := 0, 0
		for seq := range uint64(200) {
			_, rec := genRecord(seq, 256)
			switch err := w.Writer().Append("r", rec); {
			case err == nil:
				written++
			case errors.Is(err, ErrDropped):
				dropped++
			default:
				t.Fatal(err)
			}
		}
		took := time.Since(start)
		if written == 0 || dropped == 0 || written+dropped != 200 {
			t.Fatalf("%v: written %d, dropped %d", p, written, dropped)
		}
		if got := w.Ring().Stats().Dropped; got != uint64(dropped) {
			t.Fatalf("%v: ring dropped %d, want %d", p, got, dropped)
		}
		if got := c.Stats().Dropped; got != uint64(dropped) {
			t.Fatalf("%v: consumer dropped %d, want %d", p, got, dropped)
		}
		if got := e.hub.Status().Consumers[0].Dropped; got != uint64(dropped) {
			t.Fatalf("%v: status dropped %d, want %d", p, got, dropped)
		}
		// Far below one wait of the worker's minute: each drop waited the consumer's bound.
		if took > 30*time.Second {
			t.Fatalf("%v: %d drops took %v", p, dropped, took)
		}
	}
}

// A worker that leaves before its request ends: the consumer still gets every record of the
// request before its end (the gone ring counts until drained), then the ring goes.
func TestHubWorkerLeavesBeforeEnd(t *testing.T) {
	e := newHubEnv(t)
	w, err := RegisterWorker(e.client(t), WorkerOptions{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	e.hub.Begin("r1", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
	if ev := next(t, c); ev.Kind != EventBegin {
		t.Fatalf("%+v", ev)
	}
	// A record of a request not captured for fs comes first: reading it makes the consumer
	// read its connection (the ring-gone and end notices) before r1's records.
	_, other := genRecord(99, 64)
	if err := w.Writer().Append("zz", other); err != nil {
		t.Fatal(err)
	}
	for seq := range uint64(5) {
		_, rec := genRecord(seq, 64)
		if err := w.Writer().Append("r1", rec); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	waitFor(t, "the ring to go from the hub", func() bool { return len(e.hub.Status().Rings) == 0 })
	e.hub.End("r1")
	for i := range 5 {
		if ev := next(t, c); ev.Kind != EventRecord {
			t.Fatalf("event %d: %+v, want a record", i, ev.Kind)
		}
	}
	if ev := next(t, c); ev.Kind != EventEnd {
		t.Fatalf("%+v, want the end", ev.Kind)
	}
	waitFor(t, "the consumer to drop the ring", func() bool { c.Next(time.Millisecond); return c.Stats().Rings == 0 })
}

// NextBatch returns a captured request's records several at a time, every view valid until the
// next call (the writer cannot reuse their space meanwhile), skipping records not captured for
// the consumer, and a later request's begin in a call of its own.
func TestConsumerNextBatch(t *testing.T) {
	e := newHubEnv(t)
	w := e.worker(t, WorkerOptions{Capacity: 1 << 20})
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	e.hub.Begin("r1", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
	var want []Record
	for seq := range uint64(40) {
		_, rec := genRecord(seq, 128)
		if err := w.Writer().Append("r1", rec); err != nil {
			t.Fatal(err)
		}
		want = append(want, rec)
		if seq%3 == 0 {
			_, other := genRecord(seq+500, 32)
			if err := w.Writer().Append("other", other); err != nil {
				t.Fatal(err)
			}
		}
	}
	evs, err := c.NextBatch(nil, 16, 5*time.Second)
	if err != nil || len(evs) != 1 || evs[0].Kind != EventBegin {
		t.Fatalf("first batch %v, %v", evs, err)
	}
	var got []Event
	for len(got) < len(want) {
		evs, err := c.NextBatch(nil, 16, 5*time.Second)
		if err != nil || len(evs) == 0 || len(evs) > 16 {
			t.Fatalf("batch of %d, %v", len(evs), err)
		}
		if w.Ring().Stats().Occupancy == 0 {
			t.Fatal("a held batch shows no occupancy")
		}
		for _, ev := range evs { // all views of the batch at once, before the next call
			i := len(got)
			if ev.Kind != EventRecord || ev.RequestID != "r1" || !bytes.Equal(ev.Record.Data, want[i].Data) || !slices.Equal(ev.Record.Positions, want[i].Positions) {
				t.Fatalf("record %d: %+v", i, ev.Kind)
			}
			got = append(got, ev)
		}
	}
	c.Release()
	if occ := w.Ring().Stats().Occupancy; occ != 0 {
		t.Fatalf("occupancy %d after Release", occ)
	}
	e.hub.End("r1")
	if evs, err := c.NextBatch(nil, 16, 5*time.Second); err != nil || len(evs) != 1 || evs[0].Kind != EventEnd {
		t.Fatalf("end batch %v, %v", evs, err)
	}
}

// Next reads records ahead (readAhead at a time) and hands them out one a call: a Release
// while some are undelivered must not let the worker reuse their space, or it would overwrite
// records Next has still to return. The ring holds about a dozen of these records; the worker
// fills it after the Release (a Drop consumer: appends drop at once when it is full), and every
// record Next returns must be the one appended.
func TestConsumerReadAheadHeld(t *testing.T) {
	e := newHubEnv(t)
	w := e.worker(t, WorkerOptions{Capacity: 8192})
	c := e.consumer(t, ConsumerOptions{Name: "fs", Policy: Drop})
	e.hub.Begin("r1", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
	rec := func(i int) Record {
		r := Record{Hook: "post_block", Dtype: Float32, Rows: 1, Width: 128, Positions: []int{i}, Data: make([]byte, 512)}
		for j := range r.Data {
			r.Data[j] = byte(i*31 + j)
		}
		return r
	}
	for i := range 8 {
		if err := w.Writer().Append("r1", rec(i)); err != nil {
			t.Fatal(err)
		}
	}
	if ev, ok, err := c.Next(5 * time.Second); err != nil || !ok || ev.Kind != EventBegin {
		t.Fatal(ev.Kind, ok, err)
	}
	check := func(want int) {
		t.Helper()
		ev, ok, err := c.Next(5 * time.Second)
		if err != nil || !ok || ev.Kind != EventRecord || !bytes.Equal(ev.Record.Data, rec(want).Data) || ev.Record.Positions[0] != want {
			t.Fatalf("record %d: %v %v %v", want, ev.Kind, ok, err)
		}
	}
	check(0)
	c.Release()
	appended := 8
	for ; ; appended++ {
		err := w.Writer().Append("r1", rec(appended))
		if errors.Is(err, ErrDropped) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if appended >= 16 {
		t.Fatalf("%d records in an 8 KiB ring with 8 held", appended)
	}
	for i := 1; i < appended; i++ {
		check(i)
	}
	c.Release()
	if occ := w.Ring().Stats().Occupancy; occ != 0 {
		t.Fatalf("occupancy %d after every record was returned and released", occ)
	}
}

// A consumer that never reads its connection holds back no admission and no end: once its
// socket is full, a Begin does not tell it (the request's result for it is error at once,
// counted: a begin it got late would follow records it skipped), and ends queue until its
// queue is full, when the hub disconnects it (counted) and its pending requests end with
// status error. The old Begin wrote to the socket itself and waited out the write timeout
// (a minute here) at the first full socket.
func TestHubBeginNeverWaits(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	e := newHubEnv(t)
	e.hub.Close()
	var err error
	const timeout = time.Minute
	e.hub, err = NewHub(HubOptions{Consumers: map[string]string{"fs": "filesystem"}, WriteTimeout: timeout, MaxQueued: 16,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.hub.Close()
	e.hub.Serve(func(op uint16, h func([]byte) ([]byte, error)) { e.owner.Handle(op, h) })
	// The consumer, a process of its own, reads its first begin and never reads again.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hubConsumerChildEnv+"=1", "SHMSTEER_TEST_SECRET_FILE="+e.file, "SHMSTEER_TEST_NS="+e.ns)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "attached ") {
		t.Fatalf("child: %q", lines.Text())
	}
	status := func() ConsumerStatus { return e.hub.Status().Consumers[0] }
	e.hub.Begin("first", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
	if !lines.Scan() || lines.Text() != "begun first" {
		t.Fatalf("child: %q", lines.Text())
	}
	spec := json.RawMessage(`{"pad": "` + strings.Repeat("x", 1<<10) + `"}`)
	start := time.Now()
	told := 0
	for ; told < 100000 && status().BeginsDropped == 0; told++ {
		e.hub.Begin(fmt.Sprintf("r%d", told), steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": spec}, PromptLen: 1})
	}
	told-- // the last was not told
	if st := status(); st.BeginsDropped != 1 || !st.Attached || told < 1 || told >= 100000-1 {
		t.Fatalf("after %d begins: %+v", told+1, st)
	}
	untold := fmt.Sprintf("r%d", told)
	if res, _ := e.hub.Result(untold); res["fs"].Status != StatusError || !strings.Contains(res["fs"].Error, "behind on its notices") {
		t.Fatalf("%s: %+v", untold, res["fs"])
	}
	if res, _ := e.hub.Result("r0"); res["fs"].Status != StatusPending {
		t.Fatalf("r0: %+v", res["fs"])
	}
	// Ends queue behind the full socket; past MaxQueued the consumer is disconnected.
	for i := range told + 1 {
		e.hub.End(fmt.Sprintf("r%d", i))
	}
	took := time.Since(start)
	if took > timeout/2 {
		t.Fatalf("%d begins and ends took %v: the hub waited on the consumer", told+1, took)
	}
	if st := status(); st.Disconnects != 1 {
		t.Fatalf("after the ends: %+v", st)
	}
	waitFor(t, "the consumer's requests to end", func() bool {
		res, _ := e.hub.Result("r0")
		return res["fs"].Status == StatusError && strings.Contains(res["fs"].Error, "left before publishing")
	})
	waitFor(t, "the consumer to detach", func() bool { return !status().Attached })
	t.Logf("%d begins told before the socket filled; %d begins and ends in %v", told, told+1, took)
}

// A begin notice of any admissible size (a spec of steer.MaxCaptureSpec bytes, the longest
// request id) reaches a consumer that reads, several in a row: none is dropped and the
// consumer is not disconnected (it was, for a begin larger than its socket's free space).
func TestHubLargeBegin(t *testing.T) {
	e := newHubEnv(t)
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	type got struct {
		id   string
		spec []byte
	}
	evs := make(chan got, 256)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			ev, ok, err := c.Next(10 * time.Millisecond)
			if err != nil {
				done <- err
				return
			}
			if ok && ev.Kind == EventBegin {
				evs <- got{ev.RequestID, ev.Spec}
			}
		}
	}()
	pad := steer.MaxCaptureSpec - len(`{"pad":""}`)
	for i := range 3 {
		// Small requests begun before and ended while the large begin is written: their ends
		// queue behind it, and the next begin waits for them rather than being dropped.
		var smalls []string
		for j := range 50 {
			smalls = append(smalls, fmt.Sprintf("small-%d-%d", i, j))
			e.hub.Begin(smalls[j], steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
		}
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			for _, s := range smalls {
				e.hub.End(s)
				time.Sleep(50 * time.Microsecond)
			}
		}()
		spec := json.RawMessage(`{"pad":"` + strings.Repeat(strconv.Itoa(i), pad) + `"}`)
		id := strings.Repeat(strconv.Itoa(i), 65535)
		e.hub.Begin(id, steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": spec}, PromptLen: 1})
		if res, _ := e.hub.Result(id); res["fs"].Status != StatusPending {
			t.Fatalf("begin %d of a %d-byte spec: %+v", i, len(spec), res["fs"])
		}
		<-ended
	}
	for i := range 3 {
		select {
		case g := <-evs:
			for strings.HasPrefix(g.id, "small-") {
				g = <-evs
			}
			if g.id != strings.Repeat(strconv.Itoa(i), 65535) || len(g.spec) != steer.MaxCaptureSpec || g.spec[8] != byte('0'+i) {
				t.Fatalf("begin %d: id of %d bytes, spec of %d", i, len(g.id), len(g.spec))
			}
		case err := <-done:
			t.Fatalf("consumer: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("begin %d never arrived", i)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := e.hub.Status().Consumers; !st[0].Attached || st[0].Disconnects != 0 || st[0].BeginsDropped != 0 {
		t.Fatalf("consumer status: %+v", st[0])
	}
}
