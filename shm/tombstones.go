package shm

// Index tombstones, emptied.
//
// A deleted key's index word becomes a tombstone once every reader has seen its deletion
// marker (unlinkMarkers). A tombstone is reused by the next key stored on its probe path, but a
// lookup of a key that is not there reads on to the first empty word: a region that admits and
// ends requests for hours would end up with every index word a tombstone, and each miss (a
// reader's lookup of an absent key, the writer's insert of a new one) would read MaxProbe words,
// 7x the cost of a miss after 50,000 put-delete cycles in a 4096-word index (TestTombstonesEmptied).
//
// sweepTombstones empties the tombstones that no live word's probe path crosses: a key is stored
// at the first free word of its path from its home word (its hash), and a lookup reads from the
// home word to the key without meeting an empty word. A tombstone outside every such stretch
// [home, slot) lies on no path to a key, so emptying it changes no lookup's answer; a miss stops
// earlier. Live words include deletion markers still linked, so a reader pinned before a
// deletion finds its marker as before. The sweep runs under the writer lock after a commit's
// words are stored (no Tx holds a slot then), once per indexSlots/16 tombstones made, and reads
// the index and the keys of the live words: O(index + live keys' probe lengths).

// sweepTombstones empties every tombstone that no live word's probe path crosses.
func (r *Region) sweepTombstones() {
	w := r.w
	n, mask := r.l.indexSlots, r.l.mask()
	words := (n + 63) / 64
	if uint64(cap(w.covered)) < words {
		w.covered = make([]uint64, words)
	}
	cov := w.covered[:words]
	clear(cov)
	tombs := 0
	for s := uint64(0); s < n; s++ {
		word := load64(r.index, s*8)
		off, ok := wordOffset(word)
		if !ok {
			if word == tombstone {
				tombs++
			}
			continue
		}
		b, err := readBlob(r.arena, off)
		if err != nil { // the owner's own words: not expected; keep every tombstone
			return
		}
		h := keyHash(r.l.hashK0, r.l.hashK1, uint64(b.kind), b.key(r.arena))
		for p := h & mask; p != s; p = (p + 1) & mask {
			cov[p/64] |= 1 << (p % 64)
		}
	}
	w.tombs = 0
	if tombs == 0 {
		return
	}
	for s := uint64(0); s < n; s++ {
		if cov[s/64]&(1<<(s%64)) == 0 && load64(r.index, s*8) == tombstone {
			store64(r.index, s*8, 0)
		}
	}
}
