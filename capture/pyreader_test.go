package capture

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"testing"
)

// The layouts read back by a NumPy reader written from the fork's documented format
// (testdata/fork_reader.py), with /usr/bin/python3 (the interpreter with numpy; CI installs
// it): dtype, shape, positions and the bytes' digest of every site equal what was written.
func TestForkNumpyReader(t *testing.T) {
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import numpy").CombinedOutput(); err != nil {
		t.Skipf("skipped: %s cannot import numpy (%v: %s); CI installs python3-numpy", py, err, out)
	}
	for _, layout := range []Layout{LayoutPerFile, LayoutPacked} {
		for _, d := range []Dtype{Float32, BFloat16, Float16} {
			t.Run(string(layout)+"/"+string(d), func(t *testing.T) {
				root := t.TempDir()
				p, err := resolve(t, spec(`{"post_block": [0, 3], "mlp_out": "all"}`, `"all"`, `"layout": "`+string(layout)+`"`), 4)
				if err != nil {
					t.Fatal(err)
				}
				w, err := OpenRequest(root, "engine-1", p, LayoutPerFile, FSOptions{})
				if err != nil {
					t.Fatal(err)
				}
				want := simulate(t, w, p, d, 5, []step{{0, 4}, {4, 1}, {5, 1}}, rand.New(rand.NewPCG(3, 4)))
				if _, err := w.Finish(); err != nil {
					t.Fatal(err)
				}
				out, err := exec.Command(py, "testdata/fork_reader.py", w.Dir()).Output()
				if err != nil {
					t.Fatalf("fork_reader.py: %v", err)
				}
				var got map[string]struct {
					Dtype     string `json:"dtype"`
					Shape     []int  `json:"shape"`
					Sha256    string `json:"sha256"`
					Positions []int  `json:"positions"`
				}
				if err := json.Unmarshal(out, &got); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
				if len(got) != len(want) || len(want) != 8 {
					t.Fatalf("numpy read %d sites, wrote %d (want 8)", len(got), len(want))
				}
				for k, we := range want {
					g := got[fmt.Sprintf("%d_%s", k.layer, k.hook)]
					sum := sha256.Sum256(we.data)
					if g.Dtype != we.dtype || !slices.Equal(g.Shape, []int{we.rows, we.width}) ||
						g.Sha256 != hex.EncodeToString(sum[:]) || !slices.Equal(g.Positions, we.positions) {
						t.Fatalf("site %v: numpy read %+v, wrote %s %dx%d positions %v", k, g, we.dtype, we.rows, we.width, we.positions)
					}
				}
			})
		}
	}
}
