//go:build linux

package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

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
	// slots wrong, smaller than its header says, or its memfd not sealed against shrinking
	// and growing); make it with CreateRing.
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
	fd, err := unix.MemfdCreate("shmsteer-capture", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("%w: memfd: %v", ErrWrite, err)
	}
	size := int64(dataOff(slots)) + int64(capacity)
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: ftruncate: %v", ErrWrite, err)
	}
	// Sized once and for good: no process holding the memfd (the worker itself included) can
	// shrink it under a reader's mapping (SIGBUS) or grow it, and the seals cannot be lifted.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, ringSeals|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: sealing the ring: %v", ErrWrite, err)
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

// ringSeals are the seals a ring's memfd must carry before any process maps it: its size is
// fixed, so a mapping of it can never fault.
const ringSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// OpenRing maps the ring in fd (dup'ed; the caller keeps fd), checking that its memfd is sealed
// against shrinking and growing (CreateRing's seals: a ring another process could resize would
// fault its readers) and its header against the file's size: ErrRingLayout otherwise.
func OpenRing(fd int) (*Ring, error) {
	// The seals first: once they are on, the size fstat reads is the size for good.
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: not a sealable memfd (%v): make it with CreateRing", ErrRingLayout, err)
	}
	if seals&ringSeals != ringSeals {
		return nil, fmt.Errorf("%w: its memfd is not sealed against shrinking and growing (seals %#x): make it with CreateRing", ErrRingLayout, seals)
	}
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
