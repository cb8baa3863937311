//go:build linux

package capture

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
	"golang.org/x/sys/unix"
)

// hostileWorkerChildEnv runs hostileWorkerChild: "sealed" registers a ring with RegisterWorker
// and then tries to resize it; "unsealed" hands the hub a ring memfd without seals.
const hostileWorkerChildEnv = "SHMSTEER_CAPTURE_HOSTILE_WORKER"

// unsealedRing is CreateRing without the seals: a well-formed header in a memfd any holder can
// resize.
func unsealedRing(capacity uint64, slots int) (int, error) {
	fd, err := unix.MemfdCreate("hostile-ring", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	size := dataOff(slots) + int(capacity)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, err
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	defer unix.Munmap(mem)
	copy(mem, ringMagic)
	binary.LittleEndian.PutUint64(mem[8:], capacity)
	binary.LittleEndian.PutUint32(mem[16:], uint32(slots))
	for i := range slots {
		binary.LittleEndian.PutUint64(mem[offSlots+i*slotSize+8:], readUnset)
	}
	return fd, nil
}

// hostileWorkerChild is a worker process that tries to fault the owner and its consumers by
// resizing its ring after registering it. It prints what each try got, then (sealed) appends
// one record of request "r" when its stdin says so.
func hostileWorkerChild() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "hostile worker:", err)
		os.Exit(2)
	}
	cl, err := ipc.Attach(ipc.ClientOptions{Namespace: os.Getenv("SHMSTEER_TEST_NS"), SecretFile: os.Getenv("SHMSTEER_TEST_SECRET_FILE")})
	if err != nil {
		fail(err)
	}
	errText := func(err error) string {
		if err == nil {
			return "ok"
		}
		return err.Error()
	}
	in := bufio.NewScanner(os.Stdin)
	switch os.Getenv(hostileWorkerChildEnv) {
	case "sealed":
		w, err := RegisterWorker(cl, WorkerOptions{Capacity: 1 << 16, Wait: 5 * time.Second})
		if err != nil {
			fail(err)
		}
		fmt.Println("registered")
		fmt.Println("shrink:", errText(unix.Ftruncate(w.Ring().Fd(), 0)))
		fmt.Println("grow:", errText(unix.Ftruncate(w.Ring().Fd(), 1<<30)))
		_, err = unix.FcntlInt(uintptr(w.Ring().Fd()), unix.F_ADD_SEALS, unix.F_SEAL_WRITE)
		fmt.Println("reseal:", errText(err))
		in.Scan()
		_, rec := genRecord(1, 64)
		if err := w.Writer().Append("r", rec); err != nil {
			fail(err)
		}
		fmt.Println("appended")
	case "unsealed":
		fd, err := unsealedRing(1<<16, 4)
		if err != nil {
			fail(err)
		}
		link, err := dialHub(cl, roleWorker, "")
		if err != nil {
			fail(err)
		}
		if err := link.send(encodeHubMsg(nil, hubMsg{typ: msgRing}), []int{fd}); err != nil {
			fail(err)
		}
		m, err := link.recv(10 * time.Second)
		if err != nil || m.typ != msgRefused {
			fail(fmt.Errorf("the hub took an unsealed ring: message type %d, %v", m.typ, err))
		}
		fmt.Println("refused:", m.message)
		fmt.Println("shrink:", errText(unix.Ftruncate(fd, 0)))
	}
	in.Scan() // until the parent is done
	os.Exit(0)
}

// A ring's memfd is sealed against resizing once sized (and its seals against change), and a
// ring without those seals cannot be opened.
func TestRingSealed(t *testing.T) {
	r := newRing(t, 1<<16, 2)
	seals, err := unix.FcntlInt(uintptr(r.Fd()), unix.F_GET_SEALS, 0)
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL; err != nil || seals&want != want {
		t.Fatalf("seals %#x, %v; want %#x", seals, err, want)
	}
	if err := unix.Ftruncate(r.Fd(), 0); !errors.Is(err, unix.EPERM) {
		t.Fatalf("shrinking a ring: %v, want EPERM", err)
	}
	fd, err := unsealedRing(1<<16, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := OpenRing(fd); !errors.Is(err, ErrRingLayout) || !strings.Contains(err.Error(), "not sealed") {
		t.Fatalf("unsealed ring: %v", err)
	}
}

// A hostile worker process cannot fault the owner or a consumer by resizing its ring: a
// registered ring cannot be shrunk or grown (EPERM) and its seals cannot change; an unsealed
// ring is refused at registration. The owner's status (what /metrics reads) and the consumer's
// reads go on, and the consumer still reads the hostile worker's records.
func TestHubHostileWorkerResizesRing(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	e := newHubEnv(t)
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	start := func(mode string) func(string) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), hostileWorkerChildEnv+"="+mode, "SHMSTEER_TEST_SECRET_FILE="+e.file, "SHMSTEER_TEST_NS="+e.ns)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
		lines := bufio.NewScanner(out)
		expect := func(prefix string) {
			t.Helper()
			if !lines.Scan() || !strings.HasPrefix(lines.Text(), prefix) {
				t.Fatalf("%s worker: %q, want %q...", mode, lines.Text(), prefix)
			}
		}
		return func(s string) {
			t.Helper()
			if s == "" {
				fmt.Fprintln(in)
				return
			}
			expect(s)
		}
	}
	step := start("sealed")
	// The consumer reads its notices meanwhile (the registration waits for its slot).
	waitFor(t, "the consumer's slot on the hostile ring", func() bool {
		c.Next(time.Millisecond)
		st := e.hub.Status()
		return len(st.Rings) == 1 && st.Consumers[0].Rings == 1
	})
	step("registered")
	for _, want := range []string{"shrink: operation not permitted", "grow: operation not permitted", "reseal: operation not permitted"} {
		step(want)
	}
	// The owner reads the ring's counters and slots (Status: what /metrics and a consumer's
	// drop read) and the consumer reads it: nothing faults.
	if st := e.hub.Status(); len(st.Rings) != 1 || st.Consumers[0].Rings != 1 {
		t.Fatalf("after the resize tries: %+v", st)
	}
	e.hub.Begin("r", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{}`)}, PromptLen: 1})
	step("")
	step("appended")
	if ev := next(t, c); ev.Kind != EventBegin || ev.RequestID != "r" {
		t.Fatalf("want r's begin, got %+v", ev)
	}
	_, want := genRecord(1, 64)
	if ev := next(t, c); ev.Kind != EventRecord || ev.RequestID != "r" || string(ev.Record.Data) != string(want.Data) {
		t.Fatalf("want r's record, got kind %d id %q", ev.Kind, ev.RequestID)
	}
	// An unsealed ring is refused before the owner maps it; the worker resizing it then harms
	// nobody.
	step2 := start("unsealed")
	step2("refused: shmsteer: not a capture ring: its memfd is not sealed")
	step2("shrink: ok")
	st := e.hub.Status()
	if len(st.Rings) != 1 || st.Totals.Records != 1 {
		t.Fatalf("after the unsealed ring: %+v", st)
	}
	if _, ok, err := c.Next(10 * time.Millisecond); ok || err != nil {
		t.Fatalf("consumer after the unsealed ring: %v %v", ok, err)
	}
	// The hub says why it refuses the ring (RegisterWorker's error), not just disconnects.
	fd, err := unsealedRing(1<<16, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	link, err := dialHub(e.client(t), roleWorker, "")
	if err != nil {
		t.Fatal(err)
	}
	defer link.close()
	link.send(encodeHubMsg(nil, hubMsg{typ: msgRing}), []int{fd})
	if m, err := link.recv(5 * time.Second); err != nil || m.typ != msgRefused || !strings.Contains(m.message, "not sealed") {
		t.Fatalf("unsealed ring in process: type %d %q %v", m.typ, m.message, err)
	}
}
