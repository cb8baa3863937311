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
// cost is a second add per steered row of the global vector, which every row of the batch shares
// and so reads from cache. A named vector's change recomposes the sets that reference it, in
// the same transaction as the change (Engine.Register, Unregister).
//
// Layout (little-endian, 64-byte header, vector data 64-byte aligned in the value):
//
//	 0 magic "SCMP", 4 u16 version (1), 6 u16 0, 8 u32 hidden, 12 u32 sites (0: steers nothing),
//	16 u32 vectors (adds and clamp directions), 20 u32 clamps, 24 u32 refs missing when composed,
//	28 u32 0, 32 [32]byte digest of the steering set it was composed from
//	table:  sites × 24 bytes: u32 vector+1 (0: none), u32 clamp start, u32 clamp end, u32 0,
//	        u64 action hash (0: nothing at this site); site = (hook*layers + layer)*2 + phase-1
//	clamps: 16 bytes each: f32 lo, f32 hi, f32 strength, u32 direction vector
//	data:   vectors × roundUp64(hidden*4) bytes, after padding to 64

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/shm"
)

// Region kinds of compositions (see the package doc).
const (
	KindComposed       shm.Kind = 20 // key = request id
	KindComposedGlobal shm.Kind = 21 // key = globalKey
)

const (
	composedMagic   = "SCMP"
	composedVersion = 1
	siteEntry       = 24
	clampRec        = 16
)

// composition is a steering set's terms summed per site, as the owner builds it.
type composition struct {
	sites   int
	d       int
	slot    []int32 // per site: index of its vector in vecs, or -1
	act     []uint64
	vecs    []float32 // vectors, d floats each
	clamps  []clampAct
	dirs    []float32 // clamp directions, d floats each
	missing int
	digest  Digest
}

type clampAct struct {
	site        int32
	dir         int32 // index of the direction in dirs
	lo, hi, str float32
	hash        uint64
}

// compose sums the terms of w (a steering set: inline vectors, references, clamps) per site.
// lookup returns a named vector's encoding (false: not registered, the term does not apply).
// Every composed component is checked against MaxMagnitude (ErrOverflow naming set).
func compose(cfg ModelConfig, w *wire, lookup func(name string) ([]byte, bool), set string) (*composition, error) {
	sites := cfg.NumHooks() * cfg.Layers * 2
	d := cfg.Hidden
	c := &composition{sites: sites, d: d, slot: make([]int32, sites), act: make([]uint64, sites), digest: w.digest}
	for i := range c.slot {
		c.slot[i] = -1
	}
	target := func(ix int) []float32 {
		if c.slot[ix] < 0 {
			c.slot[ix] = int32(len(c.vecs) / d)
			c.vecs = append(c.vecs, make([]float32, d)...)
		}
		o := int(c.slot[ix]) * d
		return c.vecs[o : o+d]
	}
	phases := func(p Phase) []Phase {
		switch p {
		case PhasePrefill:
			return []Phase{PhasePrefill}
		case PhaseDecode:
			return []Phase{PhaseDecode}
		}
		return []Phase{PhasePrefill, PhaseDecode}
	}
	siteOf := func(hook HookID, layer int, p Phase) int { return (int(hook)*cfg.Layers+layer)*2 + int(p) - 1 }
	// Each action hash names where a contribution came from: the set's digest and the term's
	// index for inline data, the named vector's digest and the strength for references.
	for ti, v := range w.vecs {
		for _, p := range phases(v.phase) {
			ix := siteOf(v.hook, v.layer, p)
			kernels.Axpy(target(ix), v.scale, v.data)
			c.act[ix] = mix64(mix64(c.act[ix], digest64(c.digest)), uint64(ti)<<32|uint64(p))
		}
	}
	for _, r := range w.refs {
		nb, ok := lookup(r.name)
		if !ok { // unregistered since admission: the term no longer applies (last writer wins)
			c.missing++
			continue
		}
		nw, err := decode(nb, cfg, false)
		if err != nil {
			return nil, fmt.Errorf("named vector %q: %w", r.name, err)
		}
		for _, v := range nw.vecs {
			for _, p := range phases(r.phase) {
				ix := siteOf(v.hook, v.layer, p)
				kernels.Axpy(target(ix), r.strength*v.scale, v.data)
				c.act[ix] = mix64(mix64(c.act[ix], digest64(nw.digest)), uint64(math.Float32bits(r.strength))<<32|uint64(p))
			}
		}
	}
	for ix, o := range c.slot {
		if o < 0 {
			continue
		}
		for i, f := range c.vecs[int(o)*d : int(o)*d+d] {
			// The owner sums in float32; stepperMargin leaves room for its rounding over a
			// composition that checkMagnitude accepted in float64.
			if !(math.Abs(float64(f)) <= stepperMargin*MaxMagnitude) {
				site := ix / 2
				return nil, magnitudeError(set, Phase(ix%2+1), cfg, HookID(site/cfg.Layers), site%cfg.Layers,
					fmt.Sprintf("composed component %d", i), float64(f))
			}
		}
	}
	for _, cl := range w.clamps {
		for _, p := range phases(cl.phase) {
			ix := siteOf(cl.hook, cl.layer, p)
			h := mix64(mix64(digest64(c.digest), uint64(math.Float32bits(cl.lo))<<32|uint64(math.Float32bits(cl.hi))), uint64(math.Float32bits(cl.str))<<32|uint64(p))
			c.clamps = append(c.clamps, clampAct{site: int32(ix), dir: int32(len(c.dirs) / d), lo: cl.lo, hi: cl.hi, str: cl.str, hash: h})
			c.dirs = append(c.dirs, cl.dir...)
		}
	}
	// Group clamps by site, keeping their order within each, and fold them into act.
	slices.SortStableFunc(c.clamps, func(a, b clampAct) int { return int(a.site) - int(b.site) })
	for _, k := range c.clamps {
		c.act[k.site] = mix64(c.act[k.site], k.hash)
	}
	// A site with only clamps still needs a non-zero act; a zero act means "nothing to do".
	for ix := range c.act {
		if c.act[ix] == 0 && c.slot[ix] >= 0 {
			c.act[ix] = 1
		}
	}
	for _, k := range c.clamps {
		if c.act[k.site] == 0 {
			c.act[k.site] = 1
		}
	}
	return c, nil
}

func (c *composition) empty() bool { return len(c.vecs) == 0 && len(c.clamps) == 0 }

// encode writes c in the composed layout (header only when it steers nothing).
func (c *composition) encode() []byte {
	stride := int(roundUp64(uint64(c.d) * 4))
	nadd, ndir := len(c.vecs)/c.d, len(c.dirs)/c.d
	sites := c.sites
	if c.empty() {
		sites = 0
	}
	tableOff := hdrSize
	clampOff := tableOff + sites*siteEntry
	dataOff := int(roundUp64(uint64(clampOff + len(c.clamps)*clampRec)))
	if sites == 0 {
		dataOff = hdrSize
	}
	b := make([]byte, dataOff+(nadd+ndir)*stride)
	copy(b, composedMagic)
	le.PutUint16(b[4:], composedVersion)
	le.PutUint32(b[8:], uint32(c.d))
	le.PutUint32(b[12:], uint32(sites))
	le.PutUint32(b[16:], uint32(nadd+ndir))
	le.PutUint32(b[20:], uint32(len(c.clamps)))
	le.PutUint32(b[24:], uint32(c.missing))
	copy(b[32:64], c.digest[:])
	if sites == 0 {
		return b
	}
	start := 0
	for ix := 0; ix < sites; ix++ {
		e := b[tableOff+ix*siteEntry:]
		if o := c.slot[ix]; o >= 0 {
			le.PutUint32(e, uint32(o)+1)
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
	for i, k := range c.clamps {
		e := b[clampOff+i*clampRec:]
		le.PutUint32(e, math.Float32bits(k.lo))
		le.PutUint32(e[4:], math.Float32bits(k.hi))
		le.PutUint32(e[8:], math.Float32bits(k.str))
		le.PutUint32(e[12:], uint32(nadd)+uint32(k.dir))
	}
	put := func(i int, v []float32) {
		o := dataOff + i*stride
		for j, f := range v {
			le.PutUint32(b[o+4*j:], math.Float32bits(f))
		}
	}
	for i := 0; i < nadd; i++ {
		put(i, c.vecs[i*c.d:(i+1)*c.d])
	}
	for i := 0; i < ndir; i++ {
		put(nadd+i, c.dirs[i*c.d:(i+1)*c.d])
	}
	return b
}

// composedView reads a composition in place (zero-copy): its vectors alias the region.
type composedView struct {
	version uint64 // region version that wrote it (0: none)
	digest  Digest
	missing int
	sites   int
	table   []byte
	clamps  []byte
	data    []float32
	nvec    int
	stride  int // floats per vector slot
	d       int
}

// errBadComposed is the error of a composed entry that fails validation.
var errBadComposed = errors.New("bad composed steering entry")

// parseComposed validates a composed entry against cfg: every count, offset and index in
// range, so the step's hot path needs no check beyond its own site index.
func parseComposed(b []byte, cfg ModelConfig, version uint64) (composedView, error) {
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
	sites, nvec, ncl := uint64(le.Uint32(b[12:])), uint64(le.Uint32(b[16:])), uint64(le.Uint32(b[20:]))
	v := composedView{version: version, missing: int(le.Uint32(b[24:])), d: cfg.Hidden}
	copy(v.digest[:], b[32:64])
	if sites == 0 {
		if nvec != 0 || ncl != 0 || len(b) != hdrSize {
			return bad("empty set with %d vectors, %d clamps, %d bytes", nvec, ncl, len(b))
		}
		return v, nil
	}
	if sites != uint64(cfg.NumHooks()*cfg.Layers*2) {
		return bad("%d sites, model has %d", sites, cfg.NumHooks()*cfg.Layers*2)
	}
	stride := roundUp64(uint64(cfg.Hidden) * 4)
	clampOff := hdrSize + sites*siteEntry
	dataOff := roundUp64(clampOff + ncl*clampRec)
	if total := dataOff + nvec*stride; total != uint64(len(b)) {
		return bad("length %d, header implies %d", len(b), total)
	}
	v.sites, v.nvec, v.stride = int(sites), int(nvec), int(stride/4)
	v.table = b[hdrSize:clampOff:clampOff]
	v.clamps = b[clampOff : clampOff+ncl*clampRec : clampOff+ncl*clampRec]
	if nvec > 0 {
		if v.data = shm.AsFloat32(b[dataOff:]); v.data == nil {
			return bad("misaligned vector data")
		}
	}
	for ix := 0; ix < v.sites; ix++ {
		e := v.table[ix*siteEntry:]
		if vi, cs, ce := le.Uint32(e), le.Uint32(e[4:]), le.Uint32(e[8:]); uint64(vi) > nvec || cs > ce || uint64(ce) > ncl || le.Uint32(e[12:]) != 0 {
			return bad("site %d out of range", ix)
		}
	}
	for i := 0; i < int(ncl); i++ {
		if uint64(le.Uint32(v.clamps[i*clampRec+12:])) >= nvec {
			return bad("clamp %d direction out of range", i)
		}
	}
	return v, nil
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
	if vi := int(le.Uint32(e)); vi > 0 {
		o := (vi - 1) * v.stride
		vec = v.data[o : o+v.d : o+v.d]
	}
	return vec, v.clamps[int(le.Uint32(e[4:]))*clampRec : int(le.Uint32(e[8:]))*clampRec], act
}

// applyClamps runs the clamp records cl (from at) over blk.
func (v *composedView) applyClamps(blk []float32, d int, cl []byte) {
	for ; len(cl) >= clampRec; cl = cl[clampRec:] {
		o := int(le.Uint32(cl[12:])) * v.stride
		kernels.Clamp(blk, d, v.data[o:o+d], math.Float32frombits(le.Uint32(cl)), math.Float32frombits(le.Uint32(cl[4:])), math.Float32frombits(le.Uint32(cl[8:])))
	}
}
