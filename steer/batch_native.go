package steer

// A native step's resolve: the batch checksum without the device tables.
//
// A worker whose sites are applied by the Stepper on the CPU (Apply, ApplyBF16) needs from a
// Batch only what Resolve checks and its Checksum, the determinism checksum ranks and paths
// compare. ResolveNative computes that checksum from each (composition, phase, gates) key's
// content sum, kept from step to step while the global steering and the request's composition
// keep their versions, and touches none of the device path's state: no slot is assigned, no
// row staged, no gate or capture planned. Between a model's steps every cache line a resolve
// touches is one the model's weights lose; in a decode loop of a small bfloat16 model the full
// Resolve made the native step 5-7% slower than the unhooked one, against 2-3% without it.

import "fmt"

// keySum is a key's content sum and what it was computed from.
type keySum struct {
	sum        uint64
	gver, rver uint64
	rep        string
}

// maxKeySums bounds ResolveNative's cache of content sums; it is cleared when full.
const maxKeySums = 1 << 12

// ResolveNative begins a step at version, as Resolve does, and resolves batch (a layout of a
// block of rows rows: ErrBadBatch, ErrShape, ErrUnknownRequest as Resolve) for the Stepper's
// applies, setting Version and Checksum as Resolve sets them for the same batch and sites. The
// device tables' fields (Index, Sites, Updates, Gates, the capture plan) are left as they were;
// the slots are unchanged. The step stays open for Apply and ApplyBF16; on error it is ended.
func (b *Batch) ResolveNative(version uint64, batch []Span, rows int) error {
	s := b.s
	if rows < 0 {
		return fmt.Errorf("%w: %d rows", ErrShape, rows)
	}
	if b.gate.awaiting {
		s.stats.GateReportsMissed++
		b.finishGates()
	}
	if err := s.Begin(version); err != nil {
		return err
	}
	if err := s.resolve(batch, rows); err != nil {
		s.End()
		return err
	}
	if b.sums == nil {
		b.sums = make(map[slotKey]keySum)
	}
	var sum uint64
	for i := range batch {
		sp, st := &batch[i], s.cur[i]
		if sp.Start == sp.End {
			continue
		}
		var k slotKey
		if st.gates != nil && sp.Phase == PhaseDecode {
			k.gate = gateSig(st.gates)
		}
		switch {
		case st.view.sites != 0:
			k.set = st.view.digest
		case s.global.sites != 0 || k.gate != 0:
		default:
			continue
		}
		k.phase = sp.Phase
		x := mix64(sum, st.idHash)
		x = mix64(x, uint64(sp.Start)<<32|uint64(sp.End))
		x = mix64(x, uint64(sp.Phase))
		sum = mix64(x, b.keySum(k, st))
	}
	b.stats.Resolves++
	b.Version, b.Checksum = s.Version(), sum
	return nil
}

// keySum is the content sum of key k (Resolve's slot sum), st a request of the step with that
// key: from the cache while the global steering's and st's composition's versions hold.
func (b *Batch) keySum(k slotKey, st *reqState) uint64 {
	s := b.s
	gver, rver, rep := s.global.version, uint64(0), ""
	var rv *composedView
	if k.set != (Digest{}) {
		rv, rver, rep = &st.view, st.view.version, st.id
	}
	var gs *gateState
	if k.gate != 0 {
		gs, rep = st.gates, st.id
	}
	if c, ok := b.sums[k]; ok && c.gver == gver && c.rver == rver && c.rep == rep {
		return c.sum
	}
	var sum uint64
	for site := 0; site < b.nsites; site++ {
		if b.mask != nil && !b.mask[site] {
			continue
		}
		ix := site*2 + int(k.phase) - 1
		_, _, ga := s.global.at(ix)
		var ra uint64
		if rv != nil {
			_, _, ra = rv.at(ix)
		}
		if gs != nil {
			ra = gateSiteHash(gs, site, ra)
		}
		if ga != 0 || ra != 0 {
			sum = mix64(mix64(sum, uint64(site)), mix64(ga, ra))
		}
	}
	if len(b.sums) >= maxKeySums {
		clear(b.sums)
	}
	b.sums[k] = keySum{sum: sum, gver: gver, rver: rver, rep: rep}
	return sum
}
