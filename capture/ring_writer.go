//go:build linux

package capture

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/shmsteer/shmsteer/kernels"
	"golang.org/x/sys/unix"
)

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
