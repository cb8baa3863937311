//go:build linux

package capture

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// followChildEnv runs followChild: the filesystem consumer under Follow, writing under the
// directory the variable names.
const followChildEnv = "SHMSTEER_CAPTURE_FOLLOW_CHILD"

// followChild is `shmsteer capture fs` in small: Follow running RunFilesystem, printing
// "attached N" at each attach and the follower's events.
func followChild() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	n := 0
	err := Follow(ctx, FollowOptions{Client: ipc.ClientOptions{Namespace: os.Getenv("SHMSTEER_TEST_NS"), SecretFile: os.Getenv("SHMSTEER_TEST_SECRET_FILE")},
		Consumer: ConsumerOptions{Name: "fs"}, Retry: 20 * time.Millisecond, Logf: func(format string, a ...any) { fmt.Printf("log: "+format+"\n", a...) }},
		func(c *Consumer, _ *ipc.Client) error {
			n++
			fmt.Printf("attached %d\n", n)
			return RunFilesystem(ctx, c, FSConsumerOptions{Root: os.Getenv(followChildEnv), Config: testCfg, FS: FSOptions{NoFsync: true}}, nil)
		})
	fmt.Fprintln(os.Stderr, "follow child:", err)
	os.Exit(2)
}

// A filesystem consumer process under Follow attaches again when the hub drops it (as for a
// full notice queue) and when the owner restarts (a new owner and hub in the namespace), and
// captures each later request whole; it never exits meanwhile.
func TestFollowConsumerReattaches(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	e := newHubEnv(t)
	root := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), followChildEnv+"="+root, "SHMSTEER_TEST_SECRET_FILE="+e.file, "SHMSTEER_TEST_NS="+e.ns)
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
	attached := func(n int) {
		t.Helper()
		want := fmt.Sprintf("attached %d", n)
		for lines.Scan() {
			if lines.Text() == want {
				return
			}
			if !strings.HasPrefix(lines.Text(), "log: ") {
				break
			}
		}
		t.Fatalf("consumer child: %q, want %q", lines.Text(), want)
	}
	capture := func(id string) {
		t.Helper()
		waitFor(t, "the consumer attached", func() bool { return e.hub.Status().Consumers[0].Attached })
		w, err := RegisterWorker(e.client(t), WorkerOptions{Capacity: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		js := `{"request_id": "` + id + `", "tag": "follow", "hooks": {"post_block": [0, 2]}, "positions": "all"}`
		p, err := resolve(t, js, 3)
		if err != nil {
			t.Fatal(err)
		}
		e.hub.Begin(id, steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(js)}, PromptLen: 3})
		simulate(t, ringAppender{w.Writer(), id}, p, Float32, 8, []step{{0, 3}, {3, 1}}, rand.New(rand.NewPCG(1, 2)))
		e.hub.End(id)
		waitFor(t, "the result of "+id, func() bool { r, _ := e.hub.Result(id); return r["fs"].Status != StatusPending })
		res, _ := e.hub.Result(id)
		var paths []string
		if res["fs"].Status != StatusOK || json.Unmarshal(res["fs"].Payload, &paths) != nil || len(paths) != 4 {
			t.Fatalf("%s: %+v", id, res["fs"])
		}
		for _, p := range paths {
			if _, err := os.Stat(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	attached(1)
	capture("r1")
	// The hub drops it (as it does a consumer whose notice queue is full).
	e.hub.mu.Lock()
	hc := e.hub.live["fs"]
	e.hub.mu.Unlock()
	e.hub.disconnect(hc, "the test drops it")
	attached(2)
	capture("r2")
	// The owner restarts: a new owner and hub of the namespace.
	e.hub.Close()
	e.owner.Close()
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
	attached(3)
	capture("r3")
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the consumer exited: %v", err)
	}
}
