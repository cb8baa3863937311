//go:build linux

package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/steer"
	"golang.org/x/sys/unix"
)

// The capture ring: one per worker, in a writable memfd mapping of its own (never the sealed
// data region). One writer (the worker's hooks) appends framed records; each attached consumer
// reads them in order through its own slot and releases them. The writer never overwrites a
// record an attached consumer has not released: when the ring lacks space for a consumer whose
// policy is block it waits up to its bound, then (and at once for a consumer whose policy is
// drop) drops the record, counted in the ring and in each lagging consumer's slot; a lagging
// consumer whose process is gone is reclaimed instead (its slot freed). A record is
// published by one atomic store of the write position after all its bytes are written, so a
// writer killed mid-record leaves nothing a reader can see.
//
// Mapping layout (little-endian; every shared word through sync/atomic):
//
//	0    magic "shmcapr\x02", capacity (data bytes, a multiple of 64), slots
//	64   write position (bytes ever appended; publishes records)
//	128  records, bytes, dropped, reclaimed (the writer's counters)
//	192  slots × 64: state u32 + policy u32, read position, received, dropped, consumer pid,
//	     block bound (ns; 0: the writer's)
//	...  data: capacity bytes
//
// A frame at data[pos % capacity], never wrapping (a pad frame fills the tail):
//
//	0   frame length u32 (multiple of 64, header included), kind u32 (1 record, 2 pad)
//	8   layer u32, rows u32
//	16  width u32, dtype u8, hook length u8, request id length u16
//	24  positions: rows × u32, request id, hook, zero padding to 64, data, zero padding to 64
//
// Frames and their data start on 64-byte lines (the data area and capacity are multiples of
// 64): a record's rows are whole lines the writer streams (non-temporal stores) with no line
// shared with a header.

const (
	ringMagic     = "shmcapr\x02"
	frameAlign    = 64
	offWrite      = 64
	offRecords    = 128
	offBytes      = 136
	offDropped    = 144
	offReclaimed  = 152
	offSlots      = 192
	slotSize      = 64
	frameHeader   = 24
	kindRecord    = 1
	kindPad       = 2
	slotFree      = 0
	slotAttached  = 1
	slotClaiming  = 2
	readUnset     = math.MaxUint64
	MaxRingSlots  = 16
	minRingData   = 4096
	maxRingData   = 1 << 40
	maxFrameShift = 1 // a frame is at most capacity >> maxFrameShift bytes
)

// Policy is a consumer's backpressure policy.
type Policy uint32

const (
	// Block: when the ring lacks space for this consumer the writer waits up to the ring's
	// bound for it to release records, then drops the record.
	Block Policy = 1
	// Drop: the writer drops the record at once.
	Drop Policy = 2
)

var (
	// ErrRingLayout: a mapping is not a capture ring of this version (magic, capacity or
	// slots wrong, or smaller than its header says); make it with CreateRing.
	ErrRingLayout = errors.New("shmsteer: not a capture ring")
	// ErrRingCorrupt: a frame's offsets or lengths do not fit the ring or the published
	// region; the reader stops (the writer is broken or hostile).
	ErrRingCorrupt = errors.New("shmsteer: corrupt capture ring frame")
	// ErrDropped: the record was not written (no space for a lagging consumer within its
	// policy); it is counted in Stats.Dropped and the lagging slots.
	ErrDropped = errors.New("shmsteer: capture record dropped")
	// ErrRecordTooLarge: a record's frame exceeds half the ring's capacity; make the ring
	// larger or capture fewer rows per record.
	ErrRecordTooLarge = errors.New("shmsteer: capture record larger than the ring allows")
	// ErrNoSlot: every consumer slot is taken; detach a consumer or make more slots.
	ErrNoSlot = errors.New("shmsteer: no free capture consumer slot")
	// ErrBadPolicy: a consumer's policy is not block or drop, or its bound is negative.
	ErrBadPolicy = errors.New("shmsteer: bad capture consumer policy: want block or drop and a bound of 0 or more")
)

// Ring is a mapped capture ring.
type Ring struct {
	mem   []byte
	cap   uint64
	slots int
	data  []byte
	fd    int
}

func dataOff(slots int) int { return offSlots + slots*slotSize }

// CreateRing makes a ring of capacity data bytes (rounded up to 64) and slots consumer slots
// in a new memfd; Fd passes it to other processes.
func CreateRing(capacity uint64, slots int) (*Ring, error) {
	capacity = (capacity + frameAlign - 1) &^ (frameAlign - 1)
	if capacity < minRingData || capacity > maxRingData || slots < 1 || slots > MaxRingSlots {
		return nil, fmt.Errorf("%w: capacity %d not in [%d, %d] or slots %d not in [1, %d]", ErrRingLayout, capacity, minRingData, uint64(maxRingData), slots, MaxRingSlots)
	}
	fd, err := unix.MemfdCreate("shmsteer-capture", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("%w: memfd: %v", ErrWrite, err)
	}
	size := int64(dataOff(slots)) + int64(capacity)
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: ftruncate: %v", ErrWrite, err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: mmap: %v", ErrWrite, err)
	}
	copy(mem, ringMagic)
	binary.LittleEndian.PutUint64(mem[8:], capacity)
	binary.LittleEndian.PutUint32(mem[16:], uint32(slots))
	r := &Ring{mem: mem, cap: capacity, slots: slots, data: mem[dataOff(slots):], fd: fd}
	for i := range slots {
		word(mem, r.slotOff(i)+8).Store(readUnset)
	}
	return r, nil
}

// OpenRing maps the ring in fd (dup'ed; the caller keeps fd), checking its header against
// the file's size.
func OpenRing(fd int) (*Ring, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%w: fstat: %v", ErrRingLayout, err)
	}
	if st.Size < offSlots || st.Size > int64(dataOff(MaxRingSlots))+maxRingData {
		return nil, fmt.Errorf("%w: %d bytes", ErrRingLayout, st.Size)
	}
	nfd, err := unix.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("%w: dup: %v", ErrRingLayout, err)
	}
	mem, err := unix.Mmap(nfd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(nfd)
		return nil, fmt.Errorf("%w: mmap: %v", ErrRingLayout, err)
	}
	capacity := binary.LittleEndian.Uint64(mem[8:])
	slots := int(binary.LittleEndian.Uint32(mem[16:]))
	if string(mem[:8]) != ringMagic || capacity < minRingData || capacity > maxRingData || capacity%frameAlign != 0 ||
		slots < 1 || slots > MaxRingSlots || int64(dataOff(slots))+int64(capacity) != st.Size {
		unix.Munmap(mem)
		unix.Close(nfd)
		return nil, fmt.Errorf("%w: header (capacity %d, slots %d) does not match the %d-byte mapping", ErrRingLayout, capacity, slots, st.Size)
	}
	return &Ring{mem: mem, cap: capacity, slots: slots, data: mem[dataOff(slots):], fd: nfd}, nil
}

// Fd is the ring's memfd, owned by the Ring (Close closes it): give other processes a dup
// (cmd.ExtraFiles, SCM_RIGHTS), never an *os.File of this descriptor, which closes it when
// collected.
func (r *Ring) Fd() int { return r.fd }

// Close unmaps the ring and closes its descriptor.
func (r *Ring) Close() error {
	err := unix.Munmap(r.mem)
	if cerr := unix.Close(r.fd); err == nil {
		err = cerr
	}
	return err
}

func (r *Ring) slotOff(i int) int { return offSlots + i*slotSize }

// slot reads a slot's state word: attached, and its policy.
func (r *Ring) slot(so int) (bool, Policy) {
	v := word(r.mem, so).Load()
	return uint32(v) == slotAttached, Policy(v >> 32)
}

// RingStats are the writer's counters and the ring's occupancy. The writer adds to Records and
// Bytes right after each publish (one store of the write position, which is what makes records
// readable), so a writer killed between the two leaves them short by that publish's records:
// one record, or one held burst (Hold); consumers still read every published record.
type RingStats struct {
	Records   uint64 `json:"records"`         // written by the writer
	Bytes     uint64 `json:"bytes"`           // row bytes written
	Dropped   uint64 `json:"dropped"`         // records dropped (a consumer lagged past its policy)
	Reclaimed uint64 `json:"reclaimed"`       // slots of departed consumers freed
	Occupancy uint64 `json:"occupancy_bytes"` // bytes not yet released by the slowest attached consumer
}

// Stats reads the ring's counters.
func (r *Ring) Stats() RingStats {
	s := RingStats{Records: word(r.mem, offRecords).Load(), Bytes: word(r.mem, offBytes).Load(), Dropped: word(r.mem, offDropped).Load(),
		Reclaimed: word(r.mem, offReclaimed).Load()}
	wp := word(r.mem, offWrite).Load()
	for i := range r.slots {
		so := r.slotOff(i)
		if ok, _ := r.slot(so); !ok {
			continue
		}
		if rp := word(r.mem, so+8).Load(); rp != readUnset && wp-rp > s.Occupancy {
			s.Occupancy = wp - rp
		}
	}
	return s
}

// RingWriter appends records; one per ring, in one process.
type RingWriter struct {
	r       *Ring
	wait    time.Duration
	pos     uint64 // bytes appended, published or held
	pub     uint64 // bytes published (the ring's write position)
	pending uint64 // the frame length reserve wrote, published by publish
	// Held appends (Hold): records and data bytes appended since the last Flush.
	hold              bool
	heldRecs, heldLen uint64
}

// Writer is the ring's single writer; block-policy consumers make Append wait up to wait.
func (r *Ring) Writer(wait time.Duration) *RingWriter {
	p := word(r.mem, offWrite).Load()
	return &RingWriter{r: r, wait: wait, pos: p, pub: p}
}

// Hold makes later appends wait for Flush to be published (all at once: one store of the
// write position, one fence): for a writer that appends a burst of records (the hooks, one
// record per request at a site) and publishes the burst. Held records count against the
// ring's space as published ones do.
func (w *RingWriter) Hold() { w.hold = true }

// Flush publishes the held records and ends Hold.
func (w *RingWriter) Flush() {
	w.hold = false
	w.flush()
}

func (w *RingWriter) flush() {
	if w.pos == w.pub {
		return
	}
	w.pub = w.pos
	kernels.StoreFence()                 // AppendRows' non-temporal stores before the publish
	word(w.r.mem, offWrite).Store(w.pos) // publishes the frames (and the pads before them)
	// The counters follow the publish: killed here, the writer leaves them short (RingStats).
	word(w.r.mem, offRecords).Add(w.heldRecs)
	word(w.r.mem, offBytes).Add(w.heldLen)
	w.heldRecs, w.heldLen = 0, 0
}

func frameLen(rows, idLen, hookLen, nbytes int) uint64 {
	meta := uint64(frameHeader) + 4*uint64(rows) + uint64(idLen) + uint64(hookLen)
	return (meta+frameAlign-1)&^(frameAlign-1) + (uint64(nbytes)+frameAlign-1)&^(frameAlign-1)
}

var dtypeCodes = []Dtype{"", Float32, BFloat16, Float16}

func dtypeCode(d Dtype) byte {
	for i, x := range dtypeCodes {
		if x == d && i > 0 {
			return byte(i)
		}
	}
	return 0
}

// Append frames rec (of request requestID) into the ring: ErrBadRecord for a bad record or
// request id (at most 65,535 bytes, positions in [0, 2³²)), ErrRecordTooLarge, ErrDropped when
// a lagging consumer's policy (after Block's bounded wait) gives up the record. With no
// consumer attached the record is not written and Append returns nil.
func (w *RingWriter) Append(requestID string, rec Record) error {
	if err := rec.check(); err != nil {
		return err
	}
	dst, err := w.reserve(requestID, &rec, len(rec.Data))
	if dst == nil {
		return err
	}
	copy(dst, rec.Data)
	w.publish(len(rec.Data))
	return nil
}

// AppendRows is Append of a record whose data are rows rows[i] of src, a row-major block of
// rows of rec.Width elements of rec.Dtype (rec.Data is ignored; rec.Rows is len(rows)): the
// rows are copied from src straight into the ring, runs of consecutive rows in one copy, with
// non-temporal stores (kernels.StreamCopy: a consumer reads them later, from another core).
// ErrBadRecord also for a row outside src or rows not ascending.
func (w *RingWriter) AppendRows(requestID string, rec Record, src []byte, rows []int) error {
	rec.Rows = len(rows)
	rowBytes := rec.Width * rec.Dtype.Size()
	nbytes := len(rows) * rowBytes
	if err := rec.checkMeta(); err != nil {
		return err
	}
	for i, r := range rows {
		if r < 0 || (r+1)*rowBytes > len(src) || i > 0 && r <= rows[i-1] {
			return fmt.Errorf("%w: layer %d hook %q: row %d of a %d-byte block of %d-byte rows (rows must ascend)", ErrBadRecord, rec.Layer, rec.Hook, r, len(src), rowBytes)
		}
	}
	dst, err := w.reserve(requestID, &rec, nbytes)
	if dst == nil {
		return err
	}
	o := 0
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j] == rows[j-1]+1 {
			j++
		}
		o += kernels.StreamCopy(dst[o:], src[rows[i]*rowBytes:(rows[j-1]+1)*rowBytes])
		i = j
	}
	w.publish(nbytes)
	return nil
}

// reserve writes the frame of a record of nbytes data bytes up to its data (and any pad frame
// before it), after waiting for space as the consumers' policies say, and returns the data's
// bytes for the caller to fill before publish; nil (and nil error) when no consumer is attached.
func (w *RingWriter) reserve(requestID string, rec *Record, nbytes int) ([]byte, error) {
	if requestID == "" || len(requestID) > math.MaxUint16 {
		return nil, fmt.Errorf("%w: request id empty or longer than %d bytes", ErrBadRecord, math.MaxUint16)
	}
	for _, p := range rec.Positions {
		if p < 0 || p > math.MaxUint32 {
			return nil, fmt.Errorf("%w: position %d not in [0, 2³²)", ErrBadRecord, p)
		}
	}
	r := w.r
	n := frameLen(rec.Rows, len(requestID), len(rec.Hook), nbytes)
	if n > r.cap>>maxFrameShift {
		return nil, fmt.Errorf("%w: %d-byte frame, the ring's capacity is %d", ErrRecordTooLarge, n, r.cap)
	}
	pad := uint64(0)
	if off := w.pos % r.cap; off+n > r.cap {
		pad = r.cap - off
	}
	need := pad + n
	deadline := time.Time{}
	reclaimed := false
	for {
		lagging, block, bound, attached := w.lagging(need)
		if lagging > 0 && !reclaimed {
			// Once per Append that lags: a dead consumer's slot is freed, not waited for.
			reclaimed = true
			if w.reclaimDead(need) > 0 {
				continue
			}
		}
		if attached == 0 {
			return nil, nil
		}
		if lagging == 0 {
			break
		}
		if block && bound > 0 {
			if deadline.IsZero() {
				deadline = time.Now().Add(bound)
			}
			if time.Now().Before(deadline) {
				time.Sleep(20 * time.Microsecond)
				continue
			}
		}
		// Drop: count it in the ring and in each lagging slot.
		word(r.mem, offDropped).Add(1)
		for i := range r.slots {
			so := r.slotOff(i)
			if w.slotLags(so, need) {
				word(r.mem, so+24).Add(1)
			}
		}
		return nil, fmt.Errorf("%w: %d bytes needed", ErrDropped, need)
	}
	if pad > 0 {
		f := r.data[w.pos%r.cap:]
		binary.LittleEndian.PutUint32(f[0:], uint32(pad))
		binary.LittleEndian.PutUint32(f[4:], kindPad)
		w.pos += pad
	}
	f := r.data[w.pos%r.cap : w.pos%r.cap+n]
	binary.LittleEndian.PutUint32(f[0:], uint32(n))
	binary.LittleEndian.PutUint32(f[4:], kindRecord)
	binary.LittleEndian.PutUint32(f[8:], uint32(rec.Layer))
	binary.LittleEndian.PutUint32(f[12:], uint32(rec.Rows))
	binary.LittleEndian.PutUint32(f[16:], uint32(rec.Width))
	f[20] = dtypeCode(rec.Dtype)
	f[21] = byte(len(rec.Hook))
	binary.LittleEndian.PutUint16(f[22:], uint16(len(requestID)))
	o := frameHeader
	for _, p := range rec.Positions {
		binary.LittleEndian.PutUint32(f[o:], uint32(p))
		o += 4
	}
	o += copy(f[o:], requestID)
	o += copy(f[o:], rec.Hook)
	for ; o%frameAlign != 0; o++ {
		f[o] = 0
	}
	for i := o + nbytes; i < len(f); i++ {
		f[i] = 0
	}
	w.pending = n
	// The next frame's header lines, fetched while this frame's data is copied.
	next := (w.pos + n) % r.cap
	kernels.Prefetch(r.data[next:])
	if next+64 < r.cap {
		kernels.Prefetch(r.data[next+64:])
	}
	return f[o : o+nbytes : o+nbytes], nil
}

// publish makes the frame reserve wrote visible (one atomic store of the write position,
// after every byte of it) and counts it, unless the writer holds its appends (Hold).
func (w *RingWriter) publish(nbytes int) {
	w.pos += w.pending
	w.pending = 0
	w.heldRecs++
	w.heldLen += uint64(nbytes)
	if !w.hold {
		w.flush()
	}
}

// reclaimDead frees the lagging slots whose consumer process no longer exists (kill(pid, 0)
// is ESRCH) and returns how many. The pid is the consumer's own (os.Getpid at Attach), so this
// sees consumers in the writer's PID namespace; a consumer elsewhere, or a reused pid, reads as
// alive and is only waited for within the bound.
func (w *RingWriter) reclaimDead(need uint64) int {
	n := 0
	for i := range w.r.slots {
		so := w.r.slotOff(i)
		if !w.slotLags(so, need) {
			continue
		}
		pid := word(w.r.mem, so+32).Load()
		if pid == 0 || pid > math.MaxInt32 || unix.Kill(int(pid), 0) != unix.ESRCH {
			continue
		}
		st := word(w.r.mem, so)
		if v := st.Load(); uint32(v) == slotAttached && st.CompareAndSwap(v, slotFree) {
			word(w.r.mem, offReclaimed).Add(1)
			n++
		}
	}
	return n
}

// slotLags initializes an attached slot's read position (the writer's first sight of it) and
// reports whether it lacks need bytes.
func (w *RingWriter) slotLags(so int, need uint64) bool {
	if ok, _ := w.r.slot(so); !ok {
		return false
	}
	rp := word(w.r.mem, so+8)
	if rp.Load() == readUnset {
		rp.CompareAndSwap(readUnset, w.pub) // from the next published record on
	}
	used := w.pos - rp.Load()
	return used > w.r.cap || w.r.cap-used < need
}

// lagging counts the attached slots and those lacking need bytes; block says one of these has
// policy Block, bound is the shortest wait they allow (each slot's own bound, at most the
// writer's).
func (w *RingWriter) lagging(need uint64) (lagging int, block bool, bound time.Duration, attached int) {
	bound = w.wait
	for i := range w.r.slots {
		so := w.r.slotOff(i)
		ok, p := w.r.slot(so)
		if !ok {
			continue
		}
		attached++
		if w.slotLags(so, need) {
			lagging++
			if p == Block {
				block = true
				if b := word(w.r.mem, so+40).Load(); b > 0 && b < uint64(bound) {
					bound = time.Duration(b)
				}
			}
		}
	}
	return
}

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

// writePos is the ring's write position (bytes ever published).
func (r *Ring) writePos() uint64 { return word(r.mem, offWrite).Load() }

// SlotStats is one consumer slot as the writer and the owner see it.
type SlotStats struct {
	Slot     int
	Attached bool
	Policy   Policy
	PID      int           // the consumer's pid as recorded (Attach, or the owner's peer credential)
	Bound    time.Duration // its Block bound (0: the writer's)
	Received uint64        // records it read
	Dropped  uint64        // records dropped while it lagged
	Lag      uint64        // bytes published that it has not released
}

// Slots reads every slot's counters.
func (r *Ring) Slots() []SlotStats {
	wp := r.writePos()
	out := make([]SlotStats, r.slots)
	for i := range r.slots {
		so := r.slotOff(i)
		ok, p := r.slot(so)
		s := SlotStats{Slot: i, Attached: ok, Policy: p, PID: int(word(r.mem, so+32).Load() & math.MaxInt32),
			Bound: time.Duration(word(r.mem, so+40).Load() & math.MaxInt64), Received: word(r.mem, so+16).Load(), Dropped: word(r.mem, so+24).Load()}
		if rp := word(r.mem, so+8).Load(); ok && rp != readUnset && wp >= rp {
			s.Lag = wp - rp
		}
		out[i] = s
	}
	return out
}

// adoptSlot records pid (the consumer's peer credential, seen by the owner) in attached slot
// i whose recorded pid is was; it reports whether it did.
func (r *Ring) adoptSlot(i, was, pid int) bool {
	if i < 0 || i >= r.slots || pid <= 0 {
		return false
	}
	so := r.slotOff(i)
	if ok, _ := r.slot(so); !ok {
		return false
	}
	return word(r.mem, so+32).CompareAndSwap(uint64(was), uint64(pid))
}

// freeSlot frees attached slot i if its recorded pid is pid (the owner freeing a departed
// consumer's slot); it reports whether it did.
func (r *Ring) freeSlot(i, pid int) bool {
	if i < 0 || i >= r.slots {
		return false
	}
	so := r.slotOff(i)
	st := word(r.mem, so)
	v := st.Load()
	if uint32(v) != slotAttached || word(r.mem, so+32).Load() != uint64(pid) {
		return false
	}
	if st.CompareAndSwap(v, slotFree) {
		word(r.mem, offReclaimed).Add(1)
		return true
	}
	return false
}

// unread undoes the last Next: the record is returned again by the next Next.
func (c *RingReader) unread() {
	if c.last > 0 {
		c.pending -= c.last
		c.last = 0
		c.recv-- // counted by next, not yet added to the slot
	}
}
