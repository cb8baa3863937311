//go:build linux

package capture

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/shmsteer/shmsteer/steer"
)

// ringAppender appends a request's records through a worker's ring, as the hooks do.
type ringAppender struct {
	w  *RingWriter
	id string
}

func (a ringAppender) Append(r Record) error { return a.w.Append(a.id, r) }

// The filesystem consumer end to end, both layouts and every dtype: records go through a
// worker's ring to RunFilesystem (a consumer attached over ipc), which writes them at the
// request's end and publishes the paths; the fork-format readers (Go, and NumPy when
// /usr/bin/python3 has it) read back every site bitwise equal to what the worker appended.
func TestFilesystemConsumerLayouts(t *testing.T) {
	e := newHubEnv(t)
	w := e.worker(t, WorkerOptions{Capacity: 1 << 20})
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	root := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stats FSStats
	go func() {
		done <- RunFilesystem(ctx, c, FSConsumerOptions{Root: root, Config: testCfg, FS: FSOptions{NoFsync: true}}, &stats)
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	defer stop()
	py := "/usr/bin/python3"
	havePy := exec.Command(py, "-c", "import numpy").Run() == nil
	steps := []step{{0, 3}, {3, 2}, {5, 1}, {6, 1}}
	n := 0
	for _, layout := range []Layout{LayoutPerFile, LayoutPacked} {
		for _, d := range []Dtype{Float32, BFloat16, Float16} {
			n++
			id := fmt.Sprintf("engine-%d", n)
			js := `{"request_id": "req ` + id + `", "tag": "probe/v1", "hooks": {"post_block": [0, 2], "mlp_out": "all"}, "positions": "all", "layout": "` + string(layout) + `"}`
			p, err := resolve(t, js, 5)
			if err != nil {
				t.Fatal(err)
			}
			e.hub.Begin(id, steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(js)}, PromptLen: 5})
			want := simulate(t, ringAppender{w.Writer(), id}, p, d, 6, steps, rand.New(rand.NewPCG(uint64(n), 9)))
			e.hub.End(id)
			waitFor(t, "the result of "+id, func() bool { r, _ := e.hub.Result(id); return r["fs"].Status != StatusPending })
			res, _ := e.hub.Result(id)
			if res["fs"].Status != StatusOK || res["other"].Status != StatusNotRequested {
				t.Fatalf("%s: %+v", id, res)
			}
			var paths []string
			if err := json.Unmarshal(res["fs"].Payload, &paths); err != nil || len(paths) == 0 {
				t.Fatalf("payload %s: %v", res["fs"].Payload, err)
			}
			dir := filepath.Join(root, "probe%2Fv1", "req%20"+id)
			for _, pth := range paths {
				if filepath.Dir(pth) != dir {
					t.Fatalf("path %s not under %s", pth, dir)
				}
			}
			got, err := readForkRequest(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) || len(want) != 8 {
				t.Fatalf("%s: read %d sites, wrote %d (want 8)", id, len(got), len(want))
			}
			for k, we := range want {
				ge := got[k]
				if ge.dtype != we.dtype || ge.rows != we.rows || ge.width != we.width || !bytes.Equal(ge.data, we.data) || !slices.Equal(ge.positions, we.positions) {
					t.Fatalf("%s site %v: read %s %dx%d %v, wrote %s %dx%d %v", id, k, ge.dtype, ge.rows, ge.width, ge.positions, we.dtype, we.rows, we.width, we.positions)
				}
			}
			noTmp(t, root)
			if havePy {
				out, err := exec.Command(py, "testdata/fork_reader.py", dir).Output()
				if err != nil {
					t.Fatalf("fork_reader.py: %v", err)
				}
				var pyGot map[string]struct {
					Dtype     string `json:"dtype"`
					Shape     []int  `json:"shape"`
					Sha256    string `json:"sha256"`
					Positions []int  `json:"positions"`
				}
				if err := json.Unmarshal(out, &pyGot); err != nil || len(pyGot) != len(want) {
					t.Fatalf("numpy read %d sites (%v): %s", len(pyGot), err, out)
				}
				for k, we := range want {
					g := pyGot[fmt.Sprintf("%d_%s", k.layer, k.hook)]
					sum := sha256.Sum256(we.data)
					if g.Dtype != we.dtype || !slices.Equal(g.Shape, []int{we.rows, we.width}) || g.Sha256 != hex.EncodeToString(sum[:]) || !slices.Equal(g.Positions, we.positions) {
						t.Fatalf("%s site %v: numpy read %+v", id, k, g)
					}
				}
			}
		}
	}
	// A spec that does not resolve (a hook the model lacks) ends with status error.
	e.hub.Begin("bad", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(`{"request_id": "b", "tag": "t", "hooks": {"nope": "all"}}`)}, PromptLen: 5})
	e.hub.End("bad")
	waitFor(t, "the bad request's result", func() bool { r, _ := e.hub.Result("bad"); return r["fs"].Status == StatusError })
	stop() // the consumer's goroutine writes stats
	if stats.OK != 6 || stats.Failed != 1 || stats.Requests != 7 {
		t.Fatalf("stats %+v", stats)
	}
}

// Two tenants' requests with the same spec (tag and request_id) are written under each
// tenant's directory, each with its own rows; a later request of one tenant naming the same
// tag and request_id as its earlier one gets error and changes nothing of the earlier's files;
// a request whose spec selects prompt rows and of which no record came is error (no worker
// captured it), one selecting only generated rows is ok with no paths.
func TestFilesystemConsumerTenantsAndClashes(t *testing.T) {
	e := newHubEnv(t)
	w := e.worker(t, WorkerOptions{Capacity: 1 << 20})
	c := e.consumer(t, ConsumerOptions{Name: "fs"})
	root := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunFilesystem(ctx, c, FSConsumerOptions{Root: root, Config: testCfg, FS: FSOptions{NoFsync: true}}, nil)
	}()
	defer func() { cancel(); <-done }()
	const js = `{"request_id": "x", "tag": "shared", "hooks": {"post_block": [0]}, "positions": "all"}`
	p, err := resolve(t, js, 3)
	if err != nil {
		t.Fatal(err)
	}
	result := func(id string) Result {
		t.Helper()
		waitFor(t, "the result of "+id, func() bool { r, _ := e.hub.Result(id); return r["fs"].Status != StatusPending })
		r, _ := e.hub.Result(id)
		return r["fs"]
	}
	run := func(id string, seed uint64, spec string) Result {
		t.Helper()
		e.hub.Begin(id, steer.AdmittedCapture{Specs: map[string]json.RawMessage{"fs": json.RawMessage(spec)}, PromptLen: 3})
		if seed > 0 {
			simulate(t, ringAppender{w.Writer(), id}, p, Float32, 8, []step{{0, 3}}, rand.New(rand.NewPCG(seed, 1)))
		}
		e.hub.End(id)
		return result(id)
	}
	dirs := map[string]string{}
	for i, id := range []string{"acme/x", "beta/x"} {
		r := run(id, uint64(i+1), js)
		var paths []string
		if r.Status != StatusOK || json.Unmarshal(r.Payload, &paths) != nil || len(paths) != 2 {
			t.Fatalf("%s: %+v", id, r)
		}
		dirs[id] = filepath.Dir(paths[0])
		if want := filepath.Join(root, TenantDir(id), "shared", "x"); dirs[id] != want {
			t.Fatalf("%s wrote under %s, want %s", id, dirs[id], want)
		}
	}
	before, err := readForkRequest(dirs["beta/x"])
	if err != nil {
		t.Fatal(err)
	}
	if r := run("beta/y", 3, js); r.Status != StatusError || !strings.Contains(r.Error, "exists") {
		t.Fatalf("beta/y into beta/x's directory: %+v", r)
	}
	after, err := readForkRequest(dirs["beta/x"])
	if err != nil || !reflect.DeepEqual(before, after) {
		t.Fatalf("beta/x's files changed: %v", err)
	}
	if r := run("acme/none", 0, `{"request_id": "none", "tag": "t", "hooks": {"post_block": [0]}, "positions": "all"}`); r.Status != StatusError ||
		!strings.Contains(r.Error, "no rows were captured") {
		t.Fatalf("a request no worker captured: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(root, "@acme", "t", "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the uncaptured request's directory: %v", err)
	}
	if r := run("acme/gen", 0, `{"request_id": "gen", "tag": "t", "hooks": {"post_block": [0]}, "positions": "all_generated"}`); r.Status != StatusOK {
		t.Fatalf("a request with no generated rows: %+v", r)
	}
}
