package steer

// Composed steering: each steering set's terms summed once, by the owner, into the region.
//
// A step adds, to every row, global base + global phase + request base + request phase, where
// each tier holds inline vectors with scales and references to named vectors with strengths.
// Summing those terms per (hook, layer, phase) is the composition. It used to happen in every
// worker process, once per tensor-parallel rank: a private copy of every steered request's
// vectors per rank (about 5 MiB for a densely steered request). Now the owner composes each
// steering set once when it is written and stores the result under KindComposed (a request,
// key = its id) or KindComposedGlobal (the global tiers): every rank reads the same floats in
// place, and a worker's step does no composition at all.
//
// The global and request compositions stay apart, and a row gets both added: a global change
// then rewrites one entry, not every active request's, and no rank recomposes anything. The
// Stepper fuses the two at apply time: one pass over each row adds both (kernels.AddRows2), the
// global vector shared by every row of the batch and so read from cache. A named vector's change recomposes the sets that reference it, in
// the same transaction as the change (Engine.Register, Unregister).
//
// Layout (little-endian, 64-byte header, vector data 64-byte aligned in the value):
//
//	 0 magic "SCMP", 4 u16 version (3), 6 u16 columns (0, 1 or 2), 8 u32 hidden,
//	12 u32 sites (0: steers nothing), 16 u32 vectors (adds and clamp directions), 20 u32 clamps,
//	24 u32 refs missing when composed, 28 u32 in-place terms, 32 [32]byte digest of the steering
//	set it was composed from
//	table:  sites × 24 bytes: u32 vector (0: none; i+1: vector i of data; colFlag|c: the cell
//	        of (hook, layer) in column c of the list below), u32 clamp start, u32 clamp end,
//	        u32 in-place term+1 (0: none), u64 action hash (0: nothing at this site);
//	        site = (hook*layers + layer)*2 + phase-1
//	clamps: 16 bytes each: f32 lo, f32 hi, f32 strength, u32 direction vector
//	terms:  16 bytes each: u8 source (1: inline vector i of the set, 2: entry j of the set's
//	        named reference i), 3 bytes 0, u32 i, u32 j, u32 0
//	columns: u32 each, the region's column pool columns the entry names
//	data:   vectors × roundUp64(hidden*4) bytes, after padding to 64
//
// # Columns: a request's own vectors, site by site
//
// A decode step adds, at each (hook, layer), one vector per request of the batch. Stored in
// each request's entry, a site's vectors lie a whole request's steering apart (megabytes), and
// a step streams them in as many short runs. So a request composition (not the global one:
// every row reads that vector, from cache) puts the vectors that are its own (composed sums,
// and its inline vectors at coefficient 1, copied) in columns of the region's column pool
// (shm.ColumnPool): the pool is cell-major, cell (hook*layers + layer) of every column side by
// side, so the vectors a step reads at one site form one run, as a gather-add table's rows do.
// A request takes one column, or two when some (hook, layer) has different prefill and decode
// vectors (the prefill one in the first, the decode one in the second). The columns are
// attached to the entry (shm.Tx.Attach): they live exactly as long as it does, and are reused
// only when no reader pinned at a version showing it remains. Named vectors read in place stay
// in place (every request referencing one reads the same floats). When the pool is full, or
// the region has none that fits the model (RegionConfig sizes it), the vectors are stored in
// the entry as before.
//
// A site whose composition is a single term with coefficient 1 (one inline vector at scale 1,
// or one reference at strength 1 to an entry at scale 1: the common case) stores no vector: it
// names the term, and readers use the term's floats in place (in the set's own entry or in the
// named vector's). That is safe under the region's versions: the set's entry is written with its
// composition, and every change of a named vector recomposes the sets that reference it in the
// same transaction, so a composition read at a version always names data live at that version.
// A request referencing a large named vector thus costs a few bytes per site, not a copy.

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

// Region kinds of compositions (see the package doc).
const (
	KindComposed       shm.Kind = proto.KindComposed       // key = request id
	KindComposedGlobal shm.Kind = proto.KindComposedGlobal // key = globalKey
)

const (
	composedMagic   = "SCMP"
	composedVersion = 3
	siteEntry       = 24
	colFlag         = 1 << 31 // a site's vector field naming a column (the low bit: which)
	maxEntryColumns = 2
	clampRec        = 16
	termRec         = 16
	termInline      = 1 // an inline vector of the set
	termNamed       = 2 // an entry of a named vector the set references
)

// composition is a steering set's terms summed per site, as the owner builds it.
type composition struct {
	sites     int
	d         int
	slot      []int32 // per site: index of its sum in vecs, or -1 (no term, or one read in place)
	act       []uint64
	vecs      []float32 // vectors, d floats each
	clamps    []clampAct
	dirs      []float32 // clamp directions, d floats each
	missing   int
	termSites int // sites with at least one term
	digest    Digest
	// Per site: how many terms were added, the last one and its coefficient; inPlace is the
	// index in terms of the site's single coefficient-1 term (-1: the site stores its vector).
	nterms  []int32
	last    []termRef
	coef    []float32
	inPlace []int32
	terms   []termRef
	// w is the set it was composed from (its inline vectors' floats); colSlot, per site, the
	// column (0 or 1 of the entry's list) holding its vector (-1: none), set by assignColumns.
	w       *wire
	colSlot []int8
}

// termRef names one term of a steering set: source termInline (index i of the set's vectors)
// or termNamed (entry j of the named vector of the set's reference i).
type termRef struct {
	source uint8
	i, j   uint32
}

type clampAct struct {
	site        int32
	dir         int32 // index of the direction in dirs
	lo, hi, str float32
	hash        uint64
}

func (c *composition) empty() bool { return c.termSites == 0 && len(c.clamps) == 0 }

// columnData is the vector site ix would put in a column: its composed sum, or the floats of
// its single coefficient-1 inline term (the set's own, copied exactly); nil for a site with no
// vector or one read in place from a named vector (shared by every request referencing it).
func (c *composition) columnData(ix int) []float32 {
	if o := c.slot[ix]; o >= 0 {
		return c.vecs[int(o)*c.d : int(o+1)*c.d]
	}
	if c.nterms[ix] == 1 && c.coef[ix] == 1 {
		if t := c.last[ix]; t.source == termInline && c.w != nil && int(t.i) < len(c.w.vecs) {
			return c.w.vecs[t.i].data
		}
	}
	return nil
}

// sameBits reports whether a and b hold the same float32 bit patterns.
func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// assignColumns places every vector of c that is the request's own in a column (see the
// package doc's Columns section) and returns how many columns that takes (0, 1 or 2). A
// (hook, layer) whose two phases hold the same floats takes one cell; different ones take the
// first column's cell for prefill and the second's for decode. Sites it places no longer read
// their inline term in place; the term list is rebuilt without the terms no site reads.
func (c *composition) assignColumns() int {
	c.colSlot = make([]int8, c.sites)
	for i := range c.colSlot {
		c.colSlot[i] = -1
	}
	need := 0
	for ix := 0; ix+1 < c.sites; ix += 2 {
		p, q := c.columnData(ix), c.columnData(ix+1)
		switch {
		case p != nil && q != nil && !sameBits(p, q):
			c.colSlot[ix], c.colSlot[ix+1] = 0, 1
			need = 2
		case p != nil && q != nil:
			c.colSlot[ix], c.colSlot[ix+1] = 0, 0
		case p != nil:
			c.colSlot[ix] = 0
		case q != nil:
			c.colSlot[ix+1] = 0
		default:
			continue
		}
		need = max(need, 1)
	}
	if need == 0 {
		c.colSlot = nil
		return 0
	}
	// Keep only the in-place terms of sites left in place, renumbered.
	var terms []termRef
	idx := map[int32]int32{}
	for ix, k := range c.inPlace {
		if k < 0 {
			continue
		}
		if c.colSlot[ix] >= 0 {
			c.inPlace[ix] = -1
			continue
		}
		n, ok := idx[k]
		if !ok {
			n = int32(len(terms))
			idx[k] = n
			terms = append(terms, c.terms[k])
		}
		c.inPlace[ix] = n
	}
	c.terms = terms
	return need
}

// writeColumns copies the vectors assignColumns placed into their cells: cell(col, cell)
// returns the writable cell of the entry's column slot col (0 or 1).
func (c *composition) writeColumns(cell func(slot, cell int) ([]float32, error)) error {
	for ix, sl := range c.colSlot {
		if sl < 0 || (ix%2 == 1 && c.colSlot[ix-1] == sl) {
			continue // none, or the decode site sharing its prefill cell
		}
		dst, err := cell(int(sl), ix/2)
		if err != nil {
			return err
		}
		if len(dst) < c.d {
			return fmt.Errorf("%w: a column cell of %d floats for hidden size %d", ErrIncompatible, len(dst), c.d)
		}
		copy(dst, c.columnData(ix))
	}
	return nil
}

// encode writes c in the composed layout (header only when it steers nothing), naming cols
// (the region columns assignColumns' slots 0 and 1 were given) for the sites it placed there.
// A site whose prefill and decode vectors are equal (the common case: base-tier terms only)
// stores one vector for both phases.
func (c *composition) encode(cols []int) []byte {
	stride := int(roundUp64(uint64(c.d) * 4))
	out, keep := c.storedVectors()
	if c.colSlot == nil {
		cols = nil
	}
	nadd, ndir := len(keep), len(c.dirs)/c.d
	sites := c.sites
	if c.empty() {
		sites, cols = 0, nil
	}
	tableOff := hdrSize
	clampOff := tableOff + sites*siteEntry
	termOff := clampOff + len(c.clamps)*clampRec
	colOff := termOff + len(c.terms)*termRec
	dataOff := int(roundUp64(uint64(colOff + 4*len(cols))))
	if sites == 0 {
		dataOff = hdrSize
	}
	b := make([]byte, dataOff+(nadd+ndir)*stride)
	copy(b, composedMagic)
	le.PutUint16(b[4:], composedVersion)
	le.PutUint16(b[6:], uint16(len(cols)))
	le.PutUint32(b[8:], uint32(c.d))
	le.PutUint32(b[12:], uint32(sites))
	le.PutUint32(b[16:], uint32(nadd+ndir))
	le.PutUint32(b[20:], uint32(len(c.clamps)))
	le.PutUint32(b[24:], uint32(c.missing))
	le.PutUint32(b[28:], uint32(len(c.terms)))
	copy(b[32:64], c.digest[:])
	if sites == 0 {
		return b
	}
	c.putTable(b[tableOff:clampOff], out)
	c.putRecords(b[clampOff:colOff], uint32(nadd))
	for i, k := range cols {
		le.PutUint32(b[colOff+4*i:], uint32(k))
	}
	put := func(i int, v []float32) {
		o := dataOff + i*stride
		for j, f := range v {
			le.PutUint32(b[o+4*j:], math.Float32bits(f))
		}
	}
	for i, v := range keep {
		put(i, c.vecs[int(v)*c.d:int(v+1)*c.d])
	}
	for i := 0; i < ndir; i++ {
		put(nadd+i, c.dirs[i*c.d:(i+1)*c.d])
	}
	return b
}

// storedVectors lists the composed sums the entry stores (keep, in stored order: not read in
// place nor from a column) and, per sum, its stored index (out; -1: not stored). A decode sum
// equal to its prefill one shares it.
func (c *composition) storedVectors() (out, keep []int32) {
	out = make([]int32, len(c.vecs)/c.d)
	for i := range out {
		out[i] = -1
	}
	for ix := 0; ix+1 < c.sites; ix += 2 {
		p, q := c.slot[ix], c.slot[ix+1]
		if c.inPlace[ix] >= 0 || c.inColumn(ix) {
			p = -1 // read in place or from a column: nothing stored
		}
		if c.inPlace[ix+1] >= 0 || c.inColumn(ix+1) {
			q = -1
		}
		for _, v := range []int32{p, q} {
			if v >= 0 && out[v] < 0 {
				if v == q && p >= 0 && slices.Equal(c.vecs[int(p)*c.d:int(p+1)*c.d], c.vecs[int(q)*c.d:int(q+1)*c.d]) {
					out[q] = out[p]
					continue
				}
				out[v] = int32(len(keep))
				keep = append(keep, v)
			}
		}
	}
	return out, keep
}

// inColumn reports whether assignColumns placed site ix's vector in a column.
func (c *composition) inColumn(ix int) bool { return c.colSlot != nil && c.colSlot[ix] >= 0 }

// putTable writes the site table (siteEntry bytes a site) into t; out is storedVectors'.
func (c *composition) putTable(t []byte, out []int32) {
	start := 0
	for ix := 0; ix < c.sites; ix++ {
		e := t[ix*siteEntry:]
		if c.inColumn(ix) {
			le.PutUint32(e, colFlag|uint32(c.colSlot[ix]))
		} else if k := c.inPlace[ix]; k >= 0 {
			le.PutUint32(e[12:], uint32(k)+1)
		} else if o := c.slot[ix]; o >= 0 {
			le.PutUint32(e, uint32(out[o])+1)
		}
		end := start
		for end < len(c.clamps) && int(c.clamps[end].site) == ix {
			end++
		}
		le.PutUint32(e[4:], uint32(start))
		le.PutUint32(e[8:], uint32(end))
		le.PutUint64(e[16:], c.act[ix])
		start = end
	}
}

// putRecords writes the clamp records, then the term records, into r; a clamp's direction is
// stored after the nadd composed sums.
func (c *composition) putRecords(r []byte, nadd uint32) {
	for i, k := range c.clamps {
		e := r[i*clampRec:]
		le.PutUint32(e, math.Float32bits(k.lo))
		le.PutUint32(e[4:], math.Float32bits(k.hi))
		le.PutUint32(e[8:], math.Float32bits(k.str))
		le.PutUint32(e[12:], nadd+uint32(k.dir))
	}
	r = r[len(c.clamps)*clampRec:]
	for i, t := range c.terms {
		e := r[i*termRec:]
		e[0] = t.source
		le.PutUint32(e[4:], t.i)
		le.PutUint32(e[8:], t.j)
	}
}

// composedView reads a composition in place (zero-copy): its vectors alias the region, those
// of its in-place terms included (in the set's entry or a named vector's).
type composedView struct {
	version uint64 // region version that wrote it (0: none)
	digest  Digest
	missing int
	sites   int
	table   []byte
	clamps  []byte
	terms   []byte
	inPlace [][]float32 // the floats of each in-place term (resolveTerms)
	data    []float32
	nvec    int
	stride  int // floats per vector slot
	d       int
	// The region's column pool and the columns the entry names (ncols of them).
	pool  shm.ColumnPool
	cols  [maxEntryColumns]int32
	ncols int
}

// errBadComposed is the error of a composed entry that fails validation.
var errBadComposed = errors.New("bad composed steering entry")

// parseComposed validates a composed entry against cfg and the region's column pool: every
// count, offset and index in range, so the step's hot path needs no check beyond its own site
// index. The view's in-place terms are resolved by resolveTerms before it is used.
func parseComposed(b []byte, cfg ModelConfig, version uint64, pool shm.ColumnPool) (composedView, error) {
	bad := func(format string, args ...any) (composedView, error) {
		return composedView{}, fmt.Errorf("%w: %w: "+format, append([]any{ErrBadEncoding, errBadComposed}, args...)...)
	}
	if len(b) < hdrSize || string(b[:4]) != composedMagic {
		return bad("no header")
	}
	if v := le.Uint16(b[4:]); v != composedVersion {
		return bad("format version %d, this build reads %d", v, composedVersion)
	}
	if int(le.Uint32(b[8:])) != cfg.Hidden {
		return bad("hidden size %d, model has %d", le.Uint32(b[8:]), cfg.Hidden)
	}
	sites, nvec, ncl, nterm := uint64(le.Uint32(b[12:])), uint64(le.Uint32(b[16:])), uint64(le.Uint32(b[20:])), uint64(le.Uint32(b[28:]))
	ncols := uint64(le.Uint16(b[6:]))
	v := composedView{version: version, missing: int(le.Uint32(b[24:])), d: cfg.Hidden}
	copy(v.digest[:], b[32:64])
	if sites == 0 {
		if nvec != 0 || ncl != 0 || nterm != 0 || ncols != 0 || len(b) != hdrSize {
			return bad("empty set with %d vectors, %d clamps, %d terms, %d columns, %d bytes", nvec, ncl, nterm, ncols, len(b))
		}
		return v, nil
	}
	if ncols > maxEntryColumns {
		return bad("%d columns, at most %d", ncols, maxEntryColumns)
	}
	if sites != uint64(cfg.NumHooks()*cfg.Layers*2) {
		return bad("%d sites, model has %d", sites, cfg.NumHooks()*cfg.Layers*2)
	}
	stride := roundUp64(uint64(cfg.Hidden) * 4)
	clampOff := hdrSize + sites*siteEntry
	termOff := clampOff + ncl*clampRec
	colOff := termOff + nterm*termRec
	dataOff := roundUp64(colOff + 4*ncols)
	if nvec > uint64(len(b)) || nterm > uint64(len(b)) || ncl > uint64(len(b)) || dataOff+nvec*stride != uint64(len(b)) {
		return bad("length %d, header implies %d", len(b), dataOff+nvec*stride)
	}
	if ncols > 0 {
		pc, pcells, pbytes := pool.Geometry()
		if pcells != int(sites/2) || pbytes < 4*cfg.Hidden {
			return bad("names %d columns, but the region's column pool (%d cells of %d bytes) does not fit the model (%d cells of %d floats)", ncols, pcells, pbytes, sites/2, cfg.Hidden)
		}
		for i := range int(ncols) {
			k := le.Uint32(b[colOff+4*uint64(i):])
			if uint64(k) >= uint64(pc) {
				return bad("column %d of a pool of %d", k, pc)
			}
			v.cols[i] = int32(k)
		}
		v.ncols, v.pool = int(ncols), pool
	}
	v.sites, v.nvec, v.stride = int(sites), int(nvec), int(stride/4)
	v.table = b[hdrSize:clampOff:clampOff]
	v.clamps = b[clampOff:termOff:termOff]
	v.terms = b[termOff : termOff+nterm*termRec : termOff+nterm*termRec]
	if nvec > 0 {
		if v.data = shm.AsFloat32(b[dataOff:]); v.data == nil {
			return bad("misaligned vector data")
		}
	}
	for ix := 0; ix < v.sites; ix++ {
		e := v.table[ix*siteEntry:]
		vi, cs, ce, ti := le.Uint32(e), le.Uint32(e[4:]), le.Uint32(e[8:]), le.Uint32(e[12:])
		if vi&colFlag != 0 {
			if uint64(vi&^colFlag) >= ncols {
				return bad("site %d names column %d of %d", ix, vi&^colFlag, ncols)
			}
		} else if uint64(vi) > nvec {
			return bad("site %d out of range", ix)
		}
		if cs > ce || uint64(ce) > ncl || uint64(ti) > nterm || (vi != 0 && ti != 0) {
			return bad("site %d out of range", ix)
		}
	}
	for i := 0; i < int(ncl); i++ {
		if uint64(le.Uint32(v.clamps[i*clampRec+12:])) >= nvec {
			return bad("clamp %d direction out of range", i)
		}
	}
	for i := 0; i < int(nterm); i++ {
		e := v.terms[i*termRec:]
		if (e[0] != termInline && e[0] != termNamed) || e[1]|e[2]|e[3] != 0 || le.Uint32(e[12:]) != 0 {
			return bad("term %d: bad source", i)
		}
	}
	return v, nil
}

// resolveTerms finds the floats of v's in-place terms at snapshot s: in raw, the encoding of
// the steering set v was composed from, and in the named vectors it references. The set's
// entry and v are written in one transaction, and a named vector's change rewrites v in its
// own, so what s shows is what v was composed from.
func (v *composedView) resolveTerms(s *shm.Snapshot, cfg ModelConfig, raw []byte) error {
	v.inPlace = v.inPlace[:0]
	if len(v.terms) == 0 {
		return nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %w: "+format, append([]any{ErrBadEncoding, errBadComposed}, args...)...)
	}
	w, err := decode(raw, cfg, false)
	if err != nil {
		return fmt.Errorf("the set a composition was made from: %w", err)
	}
	named := map[uint32]*wire{}
	for i := 0; i < len(v.terms)/termRec; i++ {
		e := v.terms[i*termRec:]
		ti, tj := le.Uint32(e[4:]), le.Uint32(e[8:])
		var data []float32
		switch e[0] {
		case termInline:
			if uint64(ti) >= uint64(len(w.vecs)) {
				return bad("term %d: inline vector %d of %d", i, ti, len(w.vecs))
			}
			data = w.vecs[ti].data
		case termNamed:
			if uint64(ti) >= uint64(len(w.refs)) {
				return bad("term %d: reference %d of %d", i, ti, len(w.refs))
			}
			nw := named[ti]
			if nw == nil {
				nb, _, err := s.View(KindVector, w.refs[ti].name)
				if err != nil {
					return fmt.Errorf("named vector %q of a composition: %w", w.refs[ti].name, err)
				}
				dw, err := decode(nb, cfg, false)
				if err != nil {
					return fmt.Errorf("named vector %q: %w", w.refs[ti].name, err)
				}
				nw = &dw
				named[ti] = nw
			}
			if uint64(tj) >= uint64(len(nw.vecs)) {
				return bad("term %d: entry %d of named vector %q (%d entries)", i, tj, w.refs[ti].name, len(nw.vecs))
			}
			data = nw.vecs[tj].data
		}
		if len(data) != cfg.Hidden {
			return bad("term %d: %d floats", i, len(data))
		}
		v.inPlace = append(v.inPlace, data[:len(data):len(data)])
	}
	return nil
}

// openComposed reads the composition under (kind, key) at s, with its in-place terms resolved
// from the set under (rawKind, key); pool is the region's column pool.
func openComposed(s *shm.Snapshot, cfg ModelConfig, pool shm.ColumnPool, kind shm.Kind, key string, rawKind shm.Kind) (composedView, error) {
	b, ver, err := s.View(kind, key)
	if err != nil {
		return composedView{}, err
	}
	v, err := parseComposed(b, cfg, ver, pool)
	if err != nil || len(v.terms) == 0 {
		return v, err
	}
	raw, _, err := s.View(rawKind, key)
	if err != nil {
		return composedView{}, fmt.Errorf("the set a composition was made from: %w", err)
	}
	return v, v.resolveTerms(s, cfg, raw)
}

// at returns what site ix holds: the vector to add (nil: none), the clamp records and the
// action hash. ix must be in [0, sites) for a non-empty view.
func (v *composedView) at(ix int) (vec []float32, clamps []byte, act uint64) {
	if v.sites == 0 {
		return nil, nil, 0
	}
	e := v.table[ix*siteEntry : ix*siteEntry+siteEntry]
	act = le.Uint64(e[16:])
	if act == 0 {
		return nil, nil, 0
	}
	if vi := le.Uint32(e); vi&colFlag != 0 {
		// parseComposed checked the slot and the pool's geometry: the cell holds d floats.
		if c := v.pool.CellFloat32(int(v.cols[vi&1]), ix>>1); len(c) >= v.d {
			vec = c[:v.d:v.d]
		}
	} else if vi > 0 {
		o := int(vi-1) * v.stride
		vec = v.data[o : o+v.d : o+v.d]
	} else if ti := int(le.Uint32(e[12:])); ti > 0 && ti <= len(v.inPlace) {
		vec = v.inPlace[ti-1] // resolveTerms made one per term (parseComposed checked ti)
	}
	return vec, v.clamps[int(le.Uint32(e[4:]))*clampRec : int(le.Uint32(e[8:]))*clampRec], act
}

// colOf returns the column of the region's pool that holds site ix's vector, or -1 when the
// vector is not in a column (none, in the entry, or read in place). ix must be in [0, sites)
// for a non-empty view.
func (v *composedView) colOf(ix int) int {
	if v.sites == 0 {
		return -1
	}
	if vi := le.Uint32(v.table[ix*siteEntry : ix*siteEntry+4]); vi&colFlag != 0 {
		return int(v.cols[vi&1])
	}
	return -1
}

// prefetchSite asks for site ix's table entry ahead of at(ix): a decode step reads one entry
// per request per site, each in its own entry of the region, and the step's stream of vectors
// evicts them between steps. ix must be in [0, sites) for a non-empty view.
func (v *composedView) prefetchSite(ix int) {
	if v.sites != 0 {
		kernels.Prefetch(v.table[ix*siteEntry : ix*siteEntry+siteEntry])
	}
}

// applyClamps runs the clamp records cl (from at) over blk.
func (v *composedView) applyClamps(blk []float32, d int, cl []byte) {
	for ; len(cl) >= clampRec; cl = cl[clampRec:] {
		o := int(le.Uint32(cl[12:])) * v.stride
		kernels.Clamp(blk, d, v.data[o:o+d], math.Float32frombits(le.Uint32(cl)), math.Float32frombits(le.Uint32(cl[4:])), math.Float32frombits(le.Uint32(cl[8:])))
	}
}
