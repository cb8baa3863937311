package shmlayout

import (
	"bytes"
	"os"
	"testing"
)

// The generated files are what the table renders to today: a row changed but not generated, or
// a generated file edited by hand, fails here (run `go generate ./shm`).
func TestLayoutGenerated(t *testing.T) {
	out, err := Outputs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 {
		t.Fatalf("%d outputs, want shm/layout_gen.go and capi/shmread_gen.h", len(out))
	}
	for p, want := range out {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate ./shm", p)
		}
	}
}

// The descriptor's rows fit in descSize, do not overlap, and the seeds fill the rest exactly.
func TestDescriptorRows(t *testing.T) {
	var rows []Const
	for _, g := range Groups {
		for _, r := range g.Rows {
			if len(r.Go) > 1 && r.Go[0] == 'd' && r.Go[1] >= 'A' && r.Go[1] <= 'Z' {
				rows = append(rows, r)
			}
		}
	}
	var size, seeds, kinds uint64
	for _, g := range Groups {
		for _, r := range g.Rows {
			switch r.Go {
			case "descSize":
				size = r.Val
			case "dSeeds":
				seeds = r.Val
			case "seededKinds":
				kinds = r.Val
			}
		}
	}
	if seeds+8*kinds != size {
		t.Fatalf("dSeeds %d + 8*seededKinds %d != descSize %d", seeds, kinds, size)
	}
	used := map[uint64]string{}
	for _, r := range rows {
		if r.Val%8 != 0 || r.Val >= size {
			t.Errorf("%s = %d: not a word inside the descriptor", r.Go, r.Val)
		}
		if o, dup := used[r.Val]; dup {
			t.Errorf("%s and %s share offset %d", o, r.Go, r.Val)
		}
		used[r.Val] = r.Go
	}
	if len(rows) < 10 {
		t.Fatalf("found %d descriptor rows", len(rows))
	}
}

// A broken table is refused: a repeated name, a C name without its prefix.
func TestTableChecks(t *testing.T) {
	saved := Groups
	defer func() { Groups = saved }()
	Groups = []Group{{"x", []Const{{"a", "SHM_A", 1, ""}, {"a", "SHM_B", 2, ""}}}}
	if _, err := Outputs("."); err == nil {
		t.Error("a repeated Go name was accepted")
	}
	Groups = []Group{{"x", []Const{{"a", "A", 1, ""}}}}
	if _, err := Outputs("."); err == nil {
		t.Error("a C name without SHM_ was accepted")
	}
}
