package capture

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// toDtype renders float32 values as raw little-endian elements of d: bf16 as the top 16 bits,
// f16 as IEEE half (round toward zero is enough here: the test compares bytes, not values).
func toDtype(d Dtype, vals []float32) []byte {
	var b []byte
	for _, v := range vals {
		bits := math.Float32bits(v)
		switch d {
		case Float32:
			b = binary.LittleEndian.AppendUint32(b, bits)
		case BFloat16:
			b = binary.LittleEndian.AppendUint16(b, uint16(bits>>16))
		case Float16:
			sign := uint16(bits>>16) & 0x8000
			exp := int(bits>>23&0xff) - 127 + 15
			man := uint16(bits>>13) & 0x3ff
			switch {
			case exp <= 0:
				b = binary.LittleEndian.AppendUint16(b, sign)
			case exp >= 31:
				b = binary.LittleEndian.AppendUint16(b, sign|0x7c00|man)
			default:
				b = binary.LittleEndian.AppendUint16(b, sign|uint16(exp)<<10|man)
			}
		}
	}
	return b
}

type step struct{ first, n int } // a span of a request in one step: its first absolute position and rows

// simulate runs a request's spans through a plan as a worker's hooks would: each site's hidden
// states for the span (the bytes "the hooks saw", random, with NaN payloads and -0), the rows
// Plan.Rows selects copied into one record per site per span. It returns what it appended and,
// per site, the rows it expected to read back.
func simulate(t *testing.T, w interface{ Append(Record) error }, p *Plan, d Dtype, width int, steps []step, rng *rand.Rand) map[forkKey]readEntry {
	t.Helper()
	want := map[forkKey]readEntry{}
	es := d.Size()
	for _, s := range steps {
		rows := p.Rows(nil, s.first, s.n)
		for _, site := range p.Sites {
			vals := make([]float32, s.n*width)
			for i := range vals {
				vals[i] = rng.Float32()*8 - 4
			}
			vals[0] = math.Float32frombits(0x7fc00123) // a NaN with a payload
			if len(vals) > 1 {
				vals[1] = float32(math.Copysign(0, -1))
			}
			hidden := toDtype(d, vals) // the span's rows at this site, as the hooks see them
			if len(rows) == 0 {
				continue
			}
			rec := Record{Layer: site.Layer, Hook: site.HookName, Dtype: d, Rows: len(rows), Width: width}
			for _, r := range rows {
				rec.Positions = append(rec.Positions, s.first+r)
				rec.Data = append(rec.Data, hidden[r*width*es:(r+1)*width*es]...)
			}
			if err := w.Append(rec); err != nil {
				t.Fatal(err)
			}
			k := forkKey{site.Layer, site.HookName}
			e := want[k]
			e.dtype, e.width, e.rows = string(d), width, e.rows+rec.Rows
			e.data = append(e.data, rec.Data...)
			e.positions = append(e.positions, rec.Positions...)
			want[k] = e
		}
	}
	return want
}

func noTmp(t *testing.T, root string) {
	t.Helper()
	filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(path, ".tmp") {
			t.Errorf("left behind: %s", path)
		}
		return nil
	})
}

func TestLayoutsReadBackBitwise(t *testing.T) {
	// A prompt of 5 tokens prefilled in two chunks, then three decode steps.
	steps := []step{{0, 3}, {3, 2}, {5, 1}, {6, 1}, {7, 1}}
	for _, layout := range []Layout{LayoutPerFile, LayoutPacked} {
		for _, d := range []Dtype{Float32, BFloat16, Float16} {
			for _, pos := range []string{`"all"`, `"last_prompt"`, `"all_generated"`, `[1, 3, 4]`} {
				t.Run(string(layout)+"/"+string(d)+"/"+pos, func(t *testing.T) {
					root := t.TempDir()
					p, err := resolve(t, `{"request_id": "req 1", "tag": "probe/v1", "hooks": {"post_block": [0, 2], "pre_attn": {"ranges": [[1, 1]]}},
						"positions": `+pos+`, "layout": "`+string(layout)+`"}`, 5)
					if err != nil {
						t.Fatal(err)
					}
					w, err := OpenRequest(root, "engine-7", p, LayoutPerFile, FSOptions{})
					if err != nil {
						t.Fatal(err)
					}
					want := simulate(t, w, p, d, 6, steps, rand.New(rand.NewPCG(1, uint64(len(pos)))))
					// Nothing is visible before Finish.
					if got, err := readForkRequest(w.Dir()); err != nil || len(got) != 0 {
						t.Fatalf("before Finish the reader sees %d sites, %v", len(got), err)
					}
					paths, err := w.Finish()
					if err != nil {
						t.Fatal(err)
					}
					dir := filepath.Join(root, "probe%2Fv1", "req%201")
					if w.Dir() != dir {
						t.Fatalf("dir %s, want %s", w.Dir(), dir)
					}
					wantFiles := 2
					if layout == LayoutPerFile {
						wantFiles = 2 * len(want)
					}
					if len(paths) != wantFiles {
						t.Fatalf("paths %v, want %d", paths, wantFiles)
					}
					got, err := readForkRequest(dir)
					if err != nil {
						t.Fatal(err)
					}
					if len(got) != len(want) || len(want) != 3 {
						t.Fatalf("read %d sites, wrote %d (want 3)", len(got), len(want))
					}
					for k, we := range want {
						ge := got[k]
						if ge.dtype != we.dtype || ge.rows != we.rows || ge.width != we.width ||
							!bytes.Equal(ge.data, we.data) || !slices.Equal(ge.positions, we.positions) {
							t.Fatalf("site %v: read %s %dx%d positions %v (%d bytes), wrote %s %dx%d positions %v (%d bytes)",
								k, ge.dtype, ge.rows, ge.width, ge.positions, len(ge.data), we.dtype, we.rows, we.width, we.positions, len(we.data))
						}
						if !slices.IsSorted(ge.positions) {
							t.Fatalf("positions %v out of order", ge.positions)
						}
					}
					noTmp(t, root)
					checkMetaKeys(t, dir, layout)
				})
			}
		}
	}
}

func keysOf(t *testing.T, path string, sub string) []string {
	t.Helper()
	js, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	if sub != "" {
		var es []map[string]json.RawMessage
		if err := json.Unmarshal(m[sub], &es); err != nil || len(es) == 0 {
			t.Fatalf("%s: %s: %v", path, sub, err)
		}
		m = es[0]
	}
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// The sidecars carry exactly the fork's fields.
func checkMetaKeys(t *testing.T, dir string, layout Layout) {
	t.Helper()
	join := func(ks []string) string { return strings.Join(ks, " ") }
	if layout == LayoutPacked {
		if got := join(keysOf(t, filepath.Join(dir, "packed.json"), "")); got != "dtype entries layout request_id" {
			t.Fatalf("packed.json keys %s", got)
		}
		if got := join(keysOf(t, filepath.Join(dir, "packed.json"), "entries")); got != "hook layer nbytes offset positions shape" {
			t.Fatalf("packed entry keys %s", got)
		}
		var idx struct {
			RequestID string `json:"request_id"`
			Layout    string `json:"layout"`
		}
		js, _ := os.ReadFile(filepath.Join(dir, "packed.json"))
		if json.Unmarshal(js, &idx); idx.Layout != "packed" || idx.RequestID != "engine-7" {
			t.Fatalf("packed.json layout %q request_id %q", idx.Layout, idx.RequestID)
		}
		return
	}
	sides, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, s := range sides {
		if got := join(keysOf(t, s, "")); got != "dtype hook layer positions request_id shape" {
			t.Fatalf("%s keys %s", s, got)
		}
		var side struct {
			RequestID string `json:"request_id"`
		}
		js, _ := os.ReadFile(s)
		if json.Unmarshal(js, &side); side.RequestID != "engine-7" {
			t.Fatalf("%s: request_id %q, want the engine's", s, side.RequestID)
		}
	}
	if len(sides) == 0 {
		t.Fatal("no sidecars")
	}
}

func openTest(t *testing.T, root string, layout Layout) (*RequestFiles, *Plan) {
	t.Helper()
	p, err := resolve(t, spec(`{"post_block": [0, 1]}`, `"all"`), 2)
	if err != nil {
		t.Fatal(err)
	}
	w, err := OpenRequest(root, "engine-7", p, layout, FSOptions{NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	return w, p
}

func rec(layer int, d Dtype, rows, width int) Record {
	r := Record{Layer: layer, Hook: "post_block", Dtype: d, Rows: rows, Width: width, Data: make([]byte, rows*width*d.Size())}
	for i := range rows {
		r.Positions = append(r.Positions, i)
	}
	return r
}

func TestBadRecordsChangeNothing(t *testing.T) {
	for _, layout := range []Layout{LayoutPerFile, LayoutPacked} {
		t.Run(string(layout), func(t *testing.T) {
			root := t.TempDir()
			w, _ := openTest(t, root, layout)
			if err := w.Append(rec(0, Float32, 2, 4)); err != nil {
				t.Fatal(err)
			}
			for name, r := range map[string]Record{
				"unknown dtype":        func() Record { r := rec(0, Float32, 1, 4); r.Dtype = "int8"; return r }(),
				"short data":           func() Record { r := rec(0, Float32, 1, 4); r.Data = r.Data[1:]; return r }(),
				"positions miscounted": func() Record { r := rec(0, Float32, 2, 4); r.Positions = r.Positions[:1]; return r }(),
				"zero rows":            rec(0, Float32, 0, 4),
				"negative layer":       rec(-1, Float32, 1, 4),
				"hook with a slash":    func() Record { r := rec(0, Float32, 1, 4); r.Hook = "../x"; return r }(),
				"empty hook":           func() Record { r := rec(0, Float32, 1, 4); r.Hook = ""; return r }(),
				"second dtype":         rec(1, BFloat16, 1, 4),
				"width changes":        rec(0, Float32, 1, 5),
				"huge shape":           func() Record { r := rec(0, Float32, 1, 4); r.Rows, r.Width = MaxRecordRows+1, 4; return r }(),
			} {
				if err := w.Append(r); !errors.Is(err, ErrBadRecord) {
					t.Errorf("%s: %v, want ErrBadRecord", name, err)
				}
			}
			if _, err := w.Finish(); err != nil {
				t.Fatal(err)
			}
			got, err := readForkRequest(w.Dir())
			if err != nil || len(got) != 1 || got[forkKey{0, "post_block"}].rows != 2 {
				t.Fatalf("read %v, %v; want the one good record", got, err)
			}
			if err := w.Append(rec(0, Float32, 1, 4)); !errors.Is(err, ErrFinished) {
				t.Fatalf("Append after Finish: %v", err)
			}
			if _, err := w.Finish(); !errors.Is(err, ErrFinished) {
				t.Fatalf("Finish twice: %v", err)
			}
		})
	}
}

func TestAbortPublishesNothing(t *testing.T) {
	for _, layout := range []Layout{LayoutPerFile, LayoutPacked} {
		root := t.TempDir()
		w, _ := openTest(t, root, layout)
		for l := range 2 {
			if err := w.Append(rec(l, BFloat16, 3, 8)); err != nil {
				t.Fatal(err)
			}
		}
		w.Abort()
		entries, _ := os.ReadDir(w.Dir())
		if len(entries) != 0 {
			t.Fatalf("%s: after Abort the directory holds %v", layout, entries)
		}
		if _, err := w.Finish(); !errors.Is(err, ErrFinished) {
			t.Fatalf("Finish after Abort: %v", err)
		}
	}
}

func TestEmptyRequestPublishesNothing(t *testing.T) {
	for _, layout := range []Layout{LayoutPerFile, LayoutPacked} {
		w, _ := openTest(t, t.TempDir(), layout)
		paths, err := w.Finish()
		entries, _ := os.ReadDir(w.Dir())
		if err != nil || len(paths) != 0 || len(entries) != 0 {
			t.Fatalf("%s: %v, %v, %v", layout, paths, err, entries)
		}
	}
}

// A second request with the same tag and id overwrites the first (the fork's default
// on_collision, overwrite), whole.
// A request's directory is its own: a later request naming the same tag and request_id (in
// flight or published) gets ErrWrite and changes nothing of the earlier one's files; an
// aborted request leaves no directory, so its id can be begun again.
func TestRequestDirExclusive(t *testing.T) {
	root := t.TempDir()
	w, p := openTest(t, root, LayoutPerFile)
	if err := w.Append(rec(0, Float16, 5, 4)); err != nil {
		t.Fatal(err)
	}
	// The earlier request in flight, then published: the later one is refused both times.
	for _, published := range []bool{false, true} {
		if _, err := OpenRequest(root, "engine-8", p, LayoutPerFile, FSOptions{NoFsync: true}); !errors.Is(err, ErrWrite) || !strings.Contains(err.Error(), "exists") {
			t.Fatalf("second request into %s (published %v): %v, want ErrWrite", w.Dir(), published, err)
		}
		if !published {
			if _, err := w.Finish(); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := readForkRequest(w.Dir())
	if err != nil || got[forkKey{0, "post_block"}].rows != 5 {
		t.Fatalf("read %v, %v; want the first request's 5 rows", got, err)
	}
	// A tenant's request goes under its own directory: the same spec no longer clashes.
	w2, err := OpenRequest(root, "acme/engine-9", p, LayoutPerFile, FSOptions{NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "@acme", p.TagSlug, p.IDSlug); w2.Dir() != want {
		t.Fatalf("tenant's dir %s, want %s", w2.Dir(), want)
	}
	// Aborted: its directory goes, and the id may be begun again.
	w2.Append(rec(0, Float16, 1, 4))
	w2.Abort()
	if _, err := os.Stat(w2.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("aborted request's dir: %v", err)
	}
	if _, err := OpenRequest(root, "acme/engine-9", p, LayoutPerFile, FSOptions{NoFsync: true}); err != nil {
		t.Fatalf("begun again after abort: %v", err)
	}
}

func TestTenantDir(t *testing.T) {
	for in, want := range map[string]string{"r1": "", "acme/x": "@acme", "acme/x/y": "@acme", "a b/x": "@a%20b", "/x": "@", "a_b/x": "@a_b"} {
		if got := TenantDir(in); got != want {
			t.Errorf("TenantDir(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOpenRequestErrors(t *testing.T) {
	p, err := resolve(t, spec(`{"post_block": [0]}`, `"all"`), 2)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenRequest(file, "engine-7", p, LayoutPerFile, FSOptions{}); !errors.Is(err, ErrWrite) {
		t.Fatalf("root is a file: %v, want ErrWrite", err)
	}
	if _, err := OpenRequest(t.TempDir(), "", p, LayoutPerFile, FSOptions{}); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("empty engine request id: %v", err)
	}
	if _, err := OpenRequest(t.TempDir(), "engine-7", p, "sharded", FSOptions{}); !errors.Is(err, ErrBadLayout) {
		t.Fatalf("sharded: %v", err)
	}
	for _, bad := range []struct{ tag, id string }{{"..", "r"}, {"t", "a/b"}, {"", "r"}, {"t", "."}, {"t", "x y"}} {
		q := *p
		q.TagSlug, q.IDSlug = bad.tag, bad.id
		if _, err := OpenRequest(t.TempDir(), "engine-7", &q, LayoutPerFile, FSOptions{}); !errors.Is(err, ErrBadSlug) {
			t.Errorf("slugs %q/%q: %v, want ErrBadSlug", bad.tag, bad.id, err)
		}
	}
}

// A failed publish (the final name is a directory) is ErrWrite, leaves no .tmp files and no
// .bin without its sidecar.
func TestPublishFailureLeavesNoOrphans(t *testing.T) {
	root := t.TempDir()
	w, _ := openTest(t, root, LayoutPerFile)
	for l := range 2 {
		if err := w.Append(rec(l, Float32, 1, 4)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(w.Dir(), "1_post_block.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.Dir(), "1_post_block.json", "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Finish(); !errors.Is(err, ErrWrite) {
		t.Fatalf("Finish: %v, want ErrWrite", err)
	}
	noTmp(t, root)
	if _, err := os.Stat(filepath.Join(w.Dir(), "1_post_block.bin")); !os.IsNotExist(err) {
		t.Fatalf("1_post_block.bin published without its sidecar: %v", err)
	}
	// The site published before the failure stays whole and readable.
	os.RemoveAll(filepath.Join(w.Dir(), "1_post_block.json"))
	got, err := readForkRequest(w.Dir())
	if err != nil || len(got) != 1 {
		t.Fatalf("read %v, %v", got, err)
	}
}
