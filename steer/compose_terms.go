package steer

// Composition of a steering set by the owner (composed.go describes the result and its
// layout): each site's terms counted, then summed into vectors allocated at once, checked
// against the magnitude bound, and the clamps grouped by site.

import (
	"fmt"
	"math"
	"slices"

	"github.com/shmsteer/shmsteer/kernels"
)

// compose sums the terms of w (a steering set: inline vectors, references, clamps) per site.
// lookup returns a named vector's encoding (false: not registered, the term does not apply).
// Every composed component is checked against MaxMagnitude (ErrOverflow naming set).
//
// It goes over the terms twice: once to count each site's terms (and hash them into act),
// then, with the vectors of every site that needs a sum allocated at once, to sum them. A site
// whose composition is a single term at coefficient 1 gets no sum: it reads that term in place
// (and a column, if any, takes the term's floats).
func compose(cfg ModelConfig, w *wire, lookup func(name string) ([]byte, bool), set string) (*composition, error) {
	sites := cfg.NumHooks() * cfg.Layers * 2
	c := &composition{sites: sites, d: cfg.Hidden, slot: make([]int32, sites), act: make([]uint64, sites), digest: w.digest, w: w,
		nterms: make([]int32, sites), last: make([]termRef, sites), coef: make([]float32, sites), inPlace: make([]int32, sites)}
	named, err := c.lookupRefs(cfg, w, lookup)
	if err != nil {
		return nil, err
	}
	c.countTerms(cfg, w, named)
	c.sumTerms(cfg, w, named)
	if err := c.checkSums(cfg, named, set); err != nil {
		return nil, err
	}
	c.collectInPlace()
	c.addClamps(cfg, w)
	return c, nil
}

// lookupRefs decodes the named vector of each of w's references (nil: not registered since
// admission, the term no longer applies: last writer wins) and counts the missing ones.
func (c *composition) lookupRefs(cfg ModelConfig, w *wire, lookup func(name string) ([]byte, bool)) ([]*wire, error) {
	named := make([]*wire, len(w.refs))
	for ri, r := range w.refs {
		nb, ok := lookup(r.name)
		if !ok {
			c.missing++
			continue
		}
		nw, err := decode(nb, cfg, false)
		if err != nil {
			return nil, fmt.Errorf("named vector %q: %w", r.name, err)
		}
		named[ri] = &nw
	}
	return named, nil
}

// phasesOf lists the phases a term of tier p applies in.
func phasesOf(p Phase) []Phase {
	switch p {
	case PhasePrefill:
		return []Phase{PhasePrefill}
	case PhaseDecode:
		return []Phase{PhaseDecode}
	}
	return []Phase{PhasePrefill, PhaseDecode}
}

// forTerms calls fn for every term of w at every site it applies to, in the set's order (its
// inline vectors, then each registered reference's entries), with the term's coefficient, its
// floats and the two words its action hash mixes in: the set's digest and the term's index for
// inline data, the named vector's digest and the strength for references.
func forTerms(cfg ModelConfig, w *wire, named []*wire, fn func(ix int, t termRef, coef float32, data []float32, hd, hv uint64)) {
	siteOf := func(hook HookID, layer int, p Phase) int { return (int(hook)*cfg.Layers+layer)*2 + int(p) - 1 }
	for ti, v := range w.vecs {
		for _, p := range phasesOf(v.phase) {
			fn(siteOf(v.hook, v.layer, p), termRef{termInline, uint32(ti), 0}, v.scale, v.data, digest64(w.digest), uint64(ti)<<32|uint64(p))
		}
	}
	for ri, r := range w.refs {
		nw := named[ri]
		if nw == nil {
			continue
		}
		for j, v := range nw.vecs {
			for _, p := range phasesOf(r.phase) {
				fn(siteOf(v.hook, v.layer, p), termRef{termNamed, uint32(ri), uint32(j)}, r.strength*v.scale, v.data,
					digest64(nw.digest), uint64(math.Float32bits(r.strength))<<32|uint64(p))
			}
		}
	}
}

// countTerms records each site's number of terms, its last term and coefficient, and its
// action hash; then gives a vector slot to every site that needs a sum (not a single term at
// coefficient 1) and allocates them, zeroed, at once.
func (c *composition) countTerms(cfg ModelConfig, w *wire, named []*wire) {
	forTerms(cfg, w, named, func(ix int, t termRef, coef float32, _ []float32, hd, hv uint64) {
		c.nterms[ix]++
		c.last[ix], c.coef[ix] = t, coef
		c.act[ix] = mix64(mix64(c.act[ix], hd), hv)
	})
	n := int32(0)
	for ix, k := range c.nterms {
		c.slot[ix], c.inPlace[ix] = -1, -1
		if k > 0 {
			c.termSites++
			if k > 1 || c.coef[ix] != 1 {
				c.slot[ix] = n
				n++
			}
		}
	}
	c.vecs = make([]float32, int(n)*c.d)
}

// sumTerms adds every term into the sum of its site, for the sites that have one.
func (c *composition) sumTerms(cfg ModelConfig, w *wire, named []*wire) {
	forTerms(cfg, w, named, func(ix int, _ termRef, coef float32, data []float32, _, _ uint64) {
		if o := int(c.slot[ix]); o >= 0 {
			kernels.Axpy(c.vecs[o*c.d:(o+1)*c.d], coef, data)
		}
	})
}

// siteVector is what site ix adds: its sum, or the floats of its single coefficient-1 term
// (inline or in a named vector); nil for a site with no term.
func (c *composition) siteVector(ix int, named []*wire) []float32 {
	if o := int(c.slot[ix]); o >= 0 {
		return c.vecs[o*c.d : (o+1)*c.d]
	}
	if c.nterms[ix] == 0 {
		return nil
	}
	switch t := c.last[ix]; t.source {
	case termInline:
		return c.w.vecs[t.i].data
	default:
		return named[t.i].vecs[t.j].data
	}
}

// checkSums checks every site's vector against stepperMargin×MaxMagnitude: the owner sums in
// float32, and the margin leaves room for its rounding over a composition checkMagnitude
// accepted in float64. A vector whose norm is within the bound has every component within it;
// only another is read component by component, for the error's figures.
func (c *composition) checkSums(cfg ModelConfig, named []*wire, set string) error {
	const limit = stepperMargin * MaxMagnitude
	for ix := range c.sites {
		v := c.siteVector(ix, named)
		if v == nil || kernels.Norm(v) <= limit {
			continue
		}
		for i, f := range v {
			if !(math.Abs(float64(f)) <= limit) {
				site := ix / 2
				return magnitudeError(set, Phase(ix%2+1), cfg, HookID(site/cfg.Layers), site%cfg.Layers,
					fmt.Sprintf("composed component %d", i), float64(f))
			}
		}
	}
	return nil
}

// collectInPlace lists, in terms, the single coefficient-1 terms of the sites that read them
// in place, each once.
func (c *composition) collectInPlace() {
	idx := map[termRef]int32{}
	for ix, k := range c.nterms {
		if k != 1 || c.coef[ix] != 1 {
			continue
		}
		t := c.last[ix]
		n, ok := idx[t]
		if !ok {
			n = int32(len(c.terms))
			idx[t] = n
			c.terms = append(c.terms, t)
		}
		c.inPlace[ix] = n
	}
}

// addClamps adds w's clamps, grouped by site (keeping their order within each), and folds
// them into act. A site with terms or clamps gets a non-zero act: zero means "nothing to do".
func (c *composition) addClamps(cfg ModelConfig, w *wire) {
	for _, cl := range w.clamps {
		for _, p := range phasesOf(cl.phase) {
			ix := (int(cl.hook)*cfg.Layers+cl.layer)*2 + int(p) - 1
			h := mix64(mix64(digest64(c.digest), uint64(math.Float32bits(cl.lo))<<32|uint64(math.Float32bits(cl.hi))), uint64(math.Float32bits(cl.str))<<32|uint64(p))
			c.clamps = append(c.clamps, clampAct{site: int32(ix), dir: int32(len(c.dirs) / c.d), lo: cl.lo, hi: cl.hi, str: cl.str, hash: h})
			c.dirs = append(c.dirs, cl.dir...)
		}
	}
	slices.SortStableFunc(c.clamps, func(a, b clampAct) int { return int(a.site) - int(b.site) })
	for _, k := range c.clamps {
		c.act[k.site] = mix64(c.act[k.site], k.hash)
	}
	for ix := range c.act {
		if c.act[ix] == 0 && c.nterms[ix] > 0 {
			c.act[ix] = 1
		}
	}
	for _, k := range c.clamps {
		if c.act[k.site] == 0 {
			c.act[k.site] = 1
		}
	}
}
