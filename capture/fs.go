package capture

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/shmsteer/shmsteer/steer"
)

// MaxRecordRows bounds one record's rows.
const MaxRecordRows = 1 << 24

// Dtype names a captured row's element type as the fork's sidecars do.
type Dtype string

const (
	Float32  Dtype = "float32"
	BFloat16 Dtype = "bfloat16" // stored as raw uint16 (little-endian)
	Float16  Dtype = "float16"
)

// Size is the element size in bytes (0 for an unknown dtype).
func (d Dtype) Size() int {
	switch d {
	case Float32:
		return 4
	case BFloat16, Float16:
		return 2
	}
	return 0
}

// Record is one chunk of captured rows of one site: Rows rows of Width elements, raw
// little-endian in Data (bf16 as its uint16 bits), the row at index i being the token at
// absolute position Positions[i].
type Record struct {
	Layer     int
	Hook      string
	Positions []int
	Dtype     Dtype
	Rows      int
	Width     int
	Data      []byte
}

func (r Record) check() error {
	if err := r.checkMeta(); err != nil {
		return err
	}
	if n := uint64(r.Rows) * uint64(r.Width) * uint64(r.Dtype.Size()); uint64(len(r.Data)) != n {
		return fmt.Errorf("%w: layer %d hook %q: %d bytes of data, shape [%d, %d] of %s is %d", ErrBadRecord, r.Layer, r.Hook, len(r.Data), r.Rows, r.Width, r.Dtype, n)
	}
	return nil
}

// checkMeta checks everything of r but its data's length.
func (r Record) checkMeta() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: layer %d hook %q: %s", ErrBadRecord, r.Layer, r.Hook, fmt.Sprintf(format, a...))
	}
	if r.Layer < 0 {
		return bad("negative layer")
	}
	if r.Hook == "" || len(r.Hook) > MaxConsumerName {
		return bad("hook name empty or longer than %d bytes", MaxConsumerName)
	}
	for i := 0; i < len(r.Hook); i++ {
		if !slugByte(r.Hook[i]) {
			return bad("hook name has a character outside [a-zA-Z0-9._-]")
		}
	}
	size := r.Dtype.Size()
	if size == 0 {
		return bad("unknown dtype %q (float32, bfloat16, float16)", r.Dtype)
	}
	if r.Rows < 1 || r.Width < 1 || r.Rows > MaxRecordRows || r.Width > steer.MaxHidden {
		return bad("shape [%d, %d] not in [1, %d] × [1, %d]", r.Rows, r.Width, MaxRecordRows, steer.MaxHidden)
	}
	if len(r.Positions) != r.Rows {
		return bad("%d positions for %d rows", len(r.Positions), r.Rows)
	}
	return nil
}

// FSOptions are the filesystem consumer's write options.
type FSOptions struct {
	// NoFsync skips the fsync of each file and of the request directory before and after the
	// renames (the fork's fsync=false): the atomic rename still gives readers whole files, but
	// a crash may lose published ones.
	NoFsync bool
}

type siteKey struct {
	layer int
	hook  string
}

type siteFile struct {
	f         *os.File
	width     int
	rows      int
	positions []int
}

type packedEntry struct {
	Layer     int    `json:"layer"`
	Hook      string `json:"hook"`
	Offset    int64  `json:"offset"`
	Nbytes    int64  `json:"nbytes"`
	Shape     [2]int `json:"shape"`
	Positions []int  `json:"positions"`
}

// RequestFiles writes one request's captured records under {root}/{tag}/{request_id}/ in
// the fork's layout: per_file, one {layer}_{hook}.bin (rows appended in record order) and a
// {layer}_{hook}.json sidecar {request_id, layer, hook, shape, dtype, positions} per site; or
// packed, one packed.bin (records concatenated) and a packed.json index {request_id, layout,
// dtype, entries: [{layer, hook, offset, nbytes, shape, positions}]} with one entry per
// record. Every file is written as {name}.tmp and renamed into place by Finish, so a reader
// never sees a partial file. Not safe for concurrent use.
type RequestFiles struct {
	dir       string
	requestID string
	layout    Layout
	opt       FSOptions
	dtype     Dtype
	sites     map[siteKey]*siteFile // per_file
	order     []siteKey             // per_file, first-append order
	packed    *os.File              // packed
	offset    int64
	entries   []packedEntry
	widths    map[siteKey]int // packed
	done      bool
}

// OpenRequest starts the files of the engine's request requestID (the id it was admitted
// under, which the sidecars' request_id carries, as the fork's carry its engine request id),
// planned by p, in p's layout or def when p has none, in a directory of its own it creates
// (mode 0755): {root}/{tag}/{request_id}/ from p's slugs of the spec's tag and request_id, as
// the fork's; for an engine request id of a tenant (serve's tenants' ids are "tenant/...": the
// part before the first "/"), {root}/@{tenant}/{tag}/{request_id}/ (TenantDir), so one
// tenant's spec never names another's directory. The request's directory is created
// exclusively: if it exists (another request wrote or writes there, or this one was begun
// before) OpenRequest returns ErrWrite and changes nothing. ErrBadLayout, ErrBadSlug if p's
// slugs are not Slug's output, ErrBadRecord for an empty requestID, ErrWrite if the directory
// cannot be made.
func OpenRequest(root, requestID string, p *Plan, def Layout, opt FSOptions) (*RequestFiles, error) {
	if requestID == "" {
		return nil, fmt.Errorf("%w: empty engine request id", ErrBadRecord)
	}
	layout := p.Layout.Or(def)
	if _, err := ParseLayout(string(layout)); err != nil {
		return nil, err
	}
	for _, s := range []struct{ field, slugged string }{{"tag", p.TagSlug}, {"request_id", p.IDSlug}} {
		if !isSlug(s.slugged) {
			return nil, fmt.Errorf("%w: %s %q is not a slug (use Resolve's Plan)", ErrBadSlug, s.field, s.slugged)
		}
	}
	parent := filepath.Join(root, p.TagSlug)
	if t := TenantDir(requestID); t != "" {
		parent = filepath.Join(root, t, p.TagSlug)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrWrite, err)
	}
	dir := filepath.Join(parent, p.IDSlug)
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%w: the request's directory %s exists: another request captured (or captures) under this tag and request_id; "+
				"nothing was written: give this request a request_id of its own", ErrWrite, dir)
		}
		return nil, fmt.Errorf("%w: %v", ErrWrite, err)
	}
	return &RequestFiles{dir: dir, requestID: requestID, layout: layout, opt: opt,
		sites: map[siteKey]*siteFile{}, widths: map[siteKey]int{}}, nil
}

// TenantDir is the directory under a filesystem consumer's root that the captures of engine
// request requestID go under: "@" and the Slug encoding of its tenant (the part before the
// first "/"), or "" for a request id with no "/" (no tenant). No Slug starts with "@", so no
// tag names a tenant's directory.
func TenantDir(requestID string) string {
	tenant, _, ok := strings.Cut(requestID, "/")
	if !ok {
		return ""
	}
	return "@" + escapeSegment(tenant)
}

// Empty reports whether no record was appended.
func (w *RequestFiles) Empty() bool { return len(w.sites) == 0 && w.packed == nil }

// Dir is the request's directory.
func (w *RequestFiles) Dir() string { return w.dir }

// Append writes one record's rows. A bad record (ErrBadRecord) changes nothing; a failed
// write (ErrWrite) aborts the request: its .tmp files are removed and later calls return
// ErrFinished.
func (w *RequestFiles) Append(r Record) error {
	if w.done {
		return fmt.Errorf("%w: request %q", ErrFinished, w.requestID)
	}
	if err := r.check(); err != nil {
		return err
	}
	if w.dtype != "" && r.Dtype != w.dtype {
		return fmt.Errorf("%w: dtype %s, the request's records are %s", ErrBadRecord, r.Dtype, w.dtype)
	}
	k := siteKey{r.Layer, r.Hook}
	if w.layout == LayoutPacked {
		if wd, ok := w.widths[k]; ok && wd != r.Width {
			return fmt.Errorf("%w: layer %d hook %q: width %d, its first record's is %d", ErrBadRecord, r.Layer, r.Hook, r.Width, wd)
		}
		if w.packed == nil {
			f, err := w.create("packed.bin")
			if err != nil {
				return err
			}
			w.packed = f
		}
		if err := w.write(w.packed, r.Data); err != nil {
			return err
		}
		w.widths[k] = r.Width
		w.entries = append(w.entries, packedEntry{Layer: r.Layer, Hook: r.Hook, Offset: w.offset,
			Nbytes: int64(len(r.Data)), Shape: [2]int{r.Rows, r.Width}, Positions: slices.Clone(r.Positions)})
		w.offset += int64(len(r.Data))
		w.dtype = r.Dtype
		return nil
	}
	s := w.sites[k]
	if s != nil && s.width != r.Width {
		return fmt.Errorf("%w: layer %d hook %q: width %d, its first record's is %d", ErrBadRecord, r.Layer, r.Hook, r.Width, s.width)
	}
	if s == nil {
		f, err := w.create(siteStem(k) + ".bin")
		if err != nil {
			return err
		}
		s = &siteFile{f: f, width: r.Width}
		w.sites[k] = s
		w.order = append(w.order, k)
	}
	if err := w.write(s.f, r.Data); err != nil {
		return err
	}
	s.rows += r.Rows
	s.positions = append(s.positions, r.Positions...)
	w.dtype = r.Dtype
	return nil
}

func siteStem(k siteKey) string { return strconv.Itoa(k.layer) + "_" + k.hook }

func (w *RequestFiles) create(name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(w.dir, name+".tmp"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		w.fail()
		return nil, fmt.Errorf("%w: %v", ErrWrite, err)
	}
	return f, nil
}

func (w *RequestFiles) write(f *os.File, b []byte) error {
	if _, err := f.Write(b); err != nil {
		w.fail()
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	return nil
}

// fail closes and removes every .tmp file, and the request's directory if nothing was
// published in it; the request is done.
func (w *RequestFiles) fail() {
	w.done = true
	for _, s := range w.sites {
		s.f.Close()
		os.Remove(s.f.Name())
	}
	if w.packed != nil {
		w.packed.Close()
		os.Remove(w.packed.Name())
	}
	os.Remove(w.dir) // only if empty
}

// Abort removes the request's .tmp files; nothing is published. Later calls return
// ErrFinished.
func (w *RequestFiles) Abort() {
	if !w.done {
		w.fail()
	}
}

// Finish publishes the request: each .bin is synced (unless NoFsync), closed and renamed into
// place, then its sidecar or index is written the same way, then the directory is synced. It
// returns the published paths (per_file: each site's .bin then .json, in first-append order;
// packed: packed.bin, packed.json); a request with no records publishes nothing. On ErrWrite
// the files not yet published are removed.
func (w *RequestFiles) Finish() ([]string, error) {
	if w.done {
		return nil, fmt.Errorf("%w: request %q", ErrFinished, w.requestID)
	}
	var paths []string
	var err error
	if w.layout == LayoutPacked {
		if w.packed != nil {
			paths, err = w.publish(w.packed, "packed", struct {
				RequestID string        `json:"request_id"`
				Layout    Layout        `json:"layout"`
				Dtype     Dtype         `json:"dtype"`
				Entries   []packedEntry `json:"entries"`
			}{w.requestID, LayoutPacked, w.dtype, w.entries})
		}
	} else {
		paths, err = w.publishSites()
	}
	if err == nil && !w.opt.NoFsync && len(paths) > 0 {
		err = syncDir(w.dir)
	}
	if err != nil {
		w.fail()
		return paths, err
	}
	w.done = true
	return paths, nil
}

// publishSites publishes per_file's sites: every sidecar is written as {stem}.json.tmp, all
// the .tmp files are synced at once (the fsyncs overlap, as the fork's writer threads do),
// then, in first-append order, each site's .bin and then its .json are renamed into place.
func (w *RequestFiles) publishSites() ([]string, error) {
	sides := make([]*os.File, 0, len(w.order))
	cleanup := func() {
		for _, f := range sides {
			f.Close()
			os.Remove(f.Name())
		}
	}
	for _, k := range w.order {
		s := w.sites[k]
		js, err := json.Marshal(struct {
			RequestID string `json:"request_id"`
			Layer     int    `json:"layer"`
			Hook      string `json:"hook"`
			Shape     [2]int `json:"shape"`
			Dtype     Dtype  `json:"dtype"`
			Positions []int  `json:"positions"`
		}{w.requestID, k.layer, k.hook, [2]int{s.rows, s.width}, w.dtype, s.positions})
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("%w: %v", ErrWrite, err)
		}
		f, err := os.OpenFile(filepath.Join(w.dir, siteStem(k)+".json.tmp"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("%w: %v", ErrWrite, err)
		}
		sides = append(sides, f)
		if _, err := f.Write(js); err != nil {
			cleanup()
			return nil, fmt.Errorf("%w: %v", ErrWrite, err)
		}
	}
	if !w.opt.NoFsync {
		files := slices.Clone(sides)
		for _, k := range w.order {
			files = append(files, w.sites[k].f)
		}
		if err := syncAll(files); err != nil {
			cleanup()
			return nil, err
		}
	}
	var paths []string
	for i, k := range w.order {
		bin, side := filepath.Join(w.dir, siteStem(k)+".bin"), filepath.Join(w.dir, siteStem(k)+".json")
		if err := closeRename(w.sites[k].f, bin); err != nil {
			sides = sides[i:]
			cleanup()
			return paths, err
		}
		delete(w.sites, k) // its .bin is published: fail must not remove it
		if err := closeRename(sides[i], side); err != nil {
			os.Remove(bin) // no .bin without its sidecar
			sides = sides[i+1:]
			cleanup()
			return paths, err
		}
		paths = append(paths, bin, side)
	}
	return paths, nil
}

// syncAll fsyncs files, up to 8 at once.
func syncAll(files []*os.File) error {
	var wg sync.WaitGroup
	errs := make([]error, len(files))
	sem := make(chan struct{}, 8)
	for i, f := range files {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			errs[i] = f.Sync()
			<-sem
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	return nil
}

// closeRename closes f ({final}.tmp, synced already when it must be) and renames it to final;
// on failure the .tmp is removed.
func closeRename(f *os.File, final string) error {
	err := f.Close()
	if err == nil {
		err = os.Rename(f.Name(), final)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	return nil
}

// publish syncs, closes and renames f ({stem}.bin.tmp), then writes meta as {stem}.json the
// same way.
func (w *RequestFiles) publish(f *os.File, stem string, meta any) ([]string, error) {
	bin := filepath.Join(w.dir, stem+".bin")
	if err := w.closeAndRename(f, bin); err != nil {
		return nil, err
	}
	side := filepath.Join(w.dir, stem+".json")
	if err := w.writeMeta(side, meta); err != nil {
		os.Remove(bin) // no .bin without its sidecar
		return nil, err
	}
	return []string{bin, side}, nil
}

func (w *RequestFiles) writeMeta(path string, meta any) error {
	js, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	f, err := os.OpenFile(path+".tmp", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	if _, err := f.Write(js); err != nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	return w.closeAndRename(f, path)
}

func (w *RequestFiles) closeAndRename(f *os.File, final string) error {
	var err error
	if !w.opt.NoFsync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), final)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("%w: sync %s: %v", ErrWrite, dir, err)
	}
	return nil
}

// RemoveStaleTemps removes the .tmp files under root (a filesystem consumer killed mid-request
// leaves its unpublished files as {name}.tmp; no published file ends in .tmp) and returns how
// many it removed. Run it before a consumer writes under root, never while one does. It does
// not follow symbolic links.
func RemoveStaleTemps(root string) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.HasSuffix(d.Name(), ".tmp") {
			if err := os.Remove(path); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("%w: removing stale .tmp files under %s: %v", ErrWrite, root, err)
	}
	return n, nil
}
