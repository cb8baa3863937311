//go:build linux

package capture

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/shmsteer/shmsteer/steer"
)

// RingReader is one consumer's reader: it claims a slot and reads, in order, the records
// published after the writer first sees the slot. One goroutine at a time.
type RingReader struct {
	r       *Ring
	so      int
	pending uint64 // frame bytes of the records returned and not released (Release, Next)
	last    uint64 // frame bytes of the last record returned (unread)
	recv    uint64 // records returned and not yet added to the slot's received count (Release)
	scratch frameScratch
}

// frameScratch is what a reader reuses across the records it decodes, so that a record costs
// no allocation of its own: the request ids and hooks it has read (interned: the same string
// for the same bytes) and one allocation the records' Positions are carved from.
type frameScratch struct {
	// begun, if set, names the requests the reader's consumer has begun (their id strings);
	// a record of one of them is marked begun.
	begun func(id []byte) (string, bool)
	names map[string]string
	hook  string // the last hook read (a run of records mostly shares one)
	slab  []int
}

// maxInterned bounds a reader's interned names (cleared when full: a long-lived consumer sees
// an unbounded stream of request ids).
const maxInterned = 4096

func (s *frameScratch) name(b []byte) string {
	if s == nil {
		return string(b)
	}
	if n, ok := s.names[string(b)]; ok { // no allocation for the lookup
		return n
	}
	if s.names == nil || len(s.names) >= maxInterned {
		s.names = make(map[string]string, 256)
	}
	n := string(b)
	s.names[n] = n
	return n
}

// positions returns n ints of their own (full capacity: an append cannot reach the next
// record's).
func (s *frameScratch) positions(n int) []int {
	if s == nil {
		return make([]int, n)
	}
	if cap(s.slab)-len(s.slab) < n {
		s.slab = make([]int, 0, max(1024, n))
	}
	l := len(s.slab)
	s.slab = s.slab[:l+n]
	return s.slab[l : l+n : l+n]
}

// Attach claims a free slot with policy p (Block or Drop), waiting for it at most the
// writer's bound; ErrNoSlot when all are taken.
func (r *Ring) Attach(p Policy) (*RingReader, error) { return r.AttachBound(p, 0) }

// AttachBound is Attach with this consumer's own bound on a Block wait (0: the writer's; a
// bound above the writer's is the writer's).
func (r *Ring) AttachBound(p Policy, bound time.Duration) (*RingReader, error) {
	if p != Block && p != Drop {
		return nil, fmt.Errorf("%w: policy %d, want Block or Drop", ErrBadPolicy, p)
	}
	if bound < 0 {
		return nil, fmt.Errorf("%w: negative bound %v", ErrBadPolicy, bound)
	}
	for i := range r.slots {
		so := r.slotOff(i)
		st := word(r.mem, so)
		if !st.CompareAndSwap(slotFree, slotClaiming) {
			continue
		}
		word(r.mem, so+8).Store(readUnset)
		word(r.mem, so+16).Store(0)
		word(r.mem, so+24).Store(0)
		word(r.mem, so+32).Store(uint64(os.Getpid()))
		word(r.mem, so+40).Store(uint64(bound))
		st.Store(slotAttached | uint64(p)<<32)
		return &RingReader{r: r, so: so}, nil
	}
	return nil, fmt.Errorf("%w: %d slots", ErrNoSlot, r.slots)
}

// Detach frees the reader's slot: the writer stops waiting for it.
func (c *RingReader) Detach() {
	c.countReceived()
	word(c.r.mem, c.so).Store(slotFree)
}

func (c *RingReader) countReceived() {
	if c.recv > 0 {
		word(c.r.mem, c.so+16).Add(c.recv)
		c.recv = 0
	}
}

// Received and Dropped are the slot's counters: records read, and records the writer dropped
// while this consumer lagged. The slot's received count (Ring.Slots) is brought up to date at
// each Release, not at each record (one shared-memory update per batch).
func (c *RingReader) Received() uint64 { return word(c.r.mem, c.so+16).Load() + c.recv }
func (c *RingReader) Dropped() uint64  { return word(c.r.mem, c.so+24).Load() }

// RingRecord is a record read from the ring: Data is a view of the mapping, valid until the
// reader's next Next or Release.
type RingRecord struct {
	RequestID string
	Record
	// PositionsLE is Positions as the ring holds them, rows × u32 little-endian: a view of
	// the mapping, valid as long as Data (for readers that take no copy, the C ABI).
	PositionsLE []byte
	// DataOff and PositionsOff are the offsets of Data and PositionsLE in the ring's data area
	// (Consumer.RingData).
	DataOff, PositionsOff int
	begun                 bool // its request was begun for the reader's consumer when it was read
}

// Release lets the writer reuse the record Next returned.
func (c *RingReader) Release() {
	c.countReceived()
	if c.pending > 0 {
		rp := word(c.r.mem, c.so+8)
		rp.Store(rp.Load() + c.pending)
		c.pending, c.last = 0, 0
	}
}

// Next releases the previous record and returns the next published one (false when there is
// none yet). ErrRingCorrupt if the ring's positions or a frame do not fit; the reader is
// then unusable.
func (c *RingReader) Next() (RingRecord, bool, error) {
	c.Release()
	var rec RingRecord
	ok, err := c.next(&rec)
	return rec, ok, err
}

// NextHeld returns the next published record without releasing those Next and NextHeld
// returned before: every one of them stays valid until Release (a reader that takes several
// records at once; the writer cannot reuse their space meanwhile).
func (c *RingReader) NextHeld() (RingRecord, bool, error) {
	var rec RingRecord
	ok, err := c.next(&rec)
	return rec, ok, err
}

// next decodes the next published record into *rec (a reader of many records decodes each in
// its place: a RingRecord is large to copy).
func (c *RingReader) next(rec *RingRecord) (bool, error) {
	r := c.r
	rp := word(r.mem, c.so+8)
	for {
		base := rp.Load()
		if base == readUnset {
			return false, nil
		}
		pos := base + c.pending
		wp := word(r.mem, offWrite).Load()
		if wp == pos {
			return false, nil
		}
		if wp < pos || wp-pos > r.cap || pos%frameAlign != 0 {
			return false, fmt.Errorf("%w: read position %d, write position %d, capacity %d", ErrRingCorrupt, pos, wp, r.cap)
		}
		off := pos % r.cap
		avail := min(r.cap-off, wp-pos)
		n, kind, err := decodeFrame(r.data[off:off+avail], &c.scratch, rec)
		if err != nil {
			return false, err
		}
		if kind == kindPad {
			if n != r.cap-off {
				return false, fmt.Errorf("%w: a %d-byte pad at offset %d does not end the ring", ErrRingCorrupt, n, off)
			}
			if c.pending == 0 {
				rp.Store(pos + n)
			} else {
				c.pending += n // released with the records held before it
			}
			continue
		}
		c.pending += n
		c.last = n
		c.recv++
		rec.DataOff += int(off)
		rec.PositionsOff += int(off)
		return true, nil
	}
}

// decodeFrame reads the frame at the start of b (the published bytes up to the ring's end):
// its length, kind and, for a record, the record (Data a view of b; DataOff and PositionsOff
// relative to b) into *rec, which it overwrites only for a record. Every length is checked
// against b and against the others. The record's strings and positions come from s (nil:
// allocated).
func decodeFrame(b []byte, s *frameScratch, rec *RingRecord) (uint64, uint32, error) {
	bad := func(format string, a ...any) (uint64, uint32, error) {
		return 0, 0, fmt.Errorf("%w: %s", ErrRingCorrupt, fmt.Sprintf(format, a...))
	}
	if len(b) < 8 {
		return bad("%d bytes, no frame header", len(b))
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	kind := binary.LittleEndian.Uint32(b[4:])
	if n < 8 || n%frameAlign != 0 || n > uint64(len(b)) {
		return bad("frame length %d with %d bytes published", n, len(b))
	}
	switch kind {
	case kindPad:
		return n, kind, nil
	case kindRecord:
	default:
		return bad("frame kind %d", kind)
	}
	if n < frameHeader {
		return bad("record frame of %d bytes", n)
	}
	f := b[:n]
	layer := binary.LittleEndian.Uint32(f[8:])
	rows := int(binary.LittleEndian.Uint32(f[12:]))
	width := int(binary.LittleEndian.Uint32(f[16:]))
	dc, hookLen, idLen := int(f[20]), int(f[21]), int(binary.LittleEndian.Uint16(f[22:]))
	if dc == 0 || dc >= len(dtypeCodes) {
		return bad("dtype code %d", dc)
	}
	d := dtypeCodes[dc]
	if rows < 1 || rows > MaxRecordRows || width < 1 || width > steer.MaxHidden || hookLen < 1 || idLen < 1 || layer > math.MaxInt32 {
		return bad("rows %d, width %d, hook length %d, id length %d, layer %d", rows, width, hookLen, idLen, layer)
	}
	nbytes := rows * width * d.Size()
	if frameLen(rows, idLen, hookLen, nbytes) != n {
		return bad("a %d-byte frame for %d rows of %d %s, %d+%d name bytes", n, rows, width, d, idLen, hookLen)
	}
	*rec = RingRecord{Record: Record{Layer: int(layer), Rows: rows, Width: width, Dtype: d, Positions: s.positions(rows)}}
	rec.PositionsLE = f[frameHeader : frameHeader+4*rows : frameHeader+4*rows]
	rec.PositionsOff = frameHeader
	o := frameHeader
	for i := range rows {
		rec.Positions[i] = int(binary.LittleEndian.Uint32(f[o:]))
		o += 4
	}
	if id := f[o : o+idLen]; s != nil && s.begun != nil {
		if rec.RequestID, rec.begun = s.begun(id); !rec.begun {
			rec.RequestID = s.name(id)
		}
	} else {
		rec.RequestID = s.name(id)
	}
	o += idLen
	if hook := f[o : o+hookLen]; s != nil && string(hook) == s.hook {
		rec.Hook = s.hook
	} else {
		rec.Hook = s.name(hook)
		if s != nil {
			s.hook = rec.Hook
		}
	}
	o = (o + hookLen + frameAlign - 1) &^ (frameAlign - 1)
	rec.Data = f[o : o+nbytes : o+nbytes]
	rec.DataOff = o
	return n, kind, nil
}

// Slot is the index of the reader's slot in its ring.
func (c *RingReader) Slot() int { return (c.so - offSlots) / slotSize }

// Bound is the reader's own bound on a Block wait (0: the writer's).
func (c *RingReader) Bound() time.Duration { return time.Duration(word(c.r.mem, c.so+40).Load()) }

// caughtUp reports whether the reader has read (not necessarily released) every record
// published up to write position wp.
func (c *RingReader) caughtUp(wp uint64) bool {
	pos := word(c.r.mem, c.so+8).Load()
	return pos == readUnset || pos+c.pending >= wp
}

// unread undoes the last Next: the record is returned again by the next Next.
func (c *RingReader) unread() {
	if c.last > 0 {
		c.pending -= c.last
		c.last = 0
		c.recv-- // counted by next, not yet added to the slot
	}
}
