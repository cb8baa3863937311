package shm

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Kind separates the namespaces of the values in one region (keys of the key registry, named
// vectors, ...). Kind 0 is reserved.
type Kind uint16

const (
	minIndexSlots  = 64
	maxIndexSlots  = 1 << 26
	minArenaBytes  = 64 << 10
	maxArenaBytes  = 64 << 30
	maxReaderSlots = 4096
	maxLocalSlots  = 64
	minMarkSlots   = 64
	maxMarkSlots   = 1 << 26
	maxColumns     = 1 << 20
	maxPoolBytes   = 64 << 30
	// maxDataSize bounds the data memfd of any valid layout: header, index, mark table and
	// arena at their largest, the alignment gaps, and the largest column pool.
	maxDataSize = headerSize + 8*maxIndexSlots + 4096 + markEntry*maxMarkSlots + 4096 + maxArenaBytes + poolAlign + maxPoolBytes

	// DefaultIndexSlots, DefaultArenaBytes, DefaultReaderSlots and DefaultMaxProbe are the
	// Config values used for zero fields. 32 Ki index words hold some 20 k live values (keys,
	// named vectors, requests' steering) and cost 256 KiB resident once used: revoked keys,
	// the one thing that piles up by the hundred thousand, live in the mark table instead.
	DefaultIndexSlots  = 1 << 15
	DefaultArenaBytes  = 64 << 20
	DefaultReaderSlots = 256
	// DefaultMaxProbe is 512 words (4 KiB of index, read only by a probe that finds neither
	// its key nor an empty word sooner, so a healthy index never reaches it): far above the
	// longest probe of keys of one shape at half load (TestKeyHashDoesNotCluster: at most 43
	// words over 500 salts, where random hashes of as many keys pass 64 in none of 2,000
	// trials). Layout 4's hash, without its final avalanche, clustered request ids that differ
	// in their last bytes past 64 words for one salt in a hundred (281 at worst), which the
	// old bound of 64 answered with ErrRegionFull at 40% of the index in use; 512 stays as the
	// margin for a hash's bad day.
	DefaultMaxProbe = 512
	// DefaultMarkSlots sizes the mark table: 512 Ki entries of 32 bytes (16 MiB of address
	// space, resident only as entries are written), room for the 300 k revoked keys that 5,000
	// revocations a second leave pending over a 60 s grace, at a load that keeps probes short.
	DefaultMarkSlots = 1 << 19
)

// Config sizes a region. Zero fields take the defaults.
type Config struct {
	// IndexSlots is the number of index words, a power of two; the index holds at most this
	// many keys (fewer in practice: probes are bounded by MaxProbe).
	IndexSlots int
	// ArenaBytes is the space for values, keys and blob headers, a multiple of 64. A value
	// costs its length plus its key plus 40 bytes, rounded up to 64, and a replaced value
	// stays allocated until every reader has moved past it.
	ArenaBytes int64
	// ReaderSlots is the number of reader slots shared by all processes. Each process claims
	// one per goroutine that reads concurrently (at most 64).
	ReaderSlots int
	// MaxProbe bounds the index probe length, and so the cost of a miss.
	MaxProbe int
	// MarkSlots is the number of entries of the mark table (Tx.Mark), a power of two: a mark
	// costs one 32-byte entry and no arena space. Keep it at least twice the marks that are
	// ever present at once.
	MarkSlots int
	// Columns, ColumnCells and CellBytes size the column pool (Tx.AllocColumn, Region.Columns):
	// Columns columns of ColumnCells cells of CellBytes bytes each, a positive multiple of 64,
	// in an area of the data memfd after the arena. Set all three or none (no pool). The pool
	// costs address space only until cells are written: a column's memory becomes resident as
	// its cells are written (with that cell of the 7 adjacent columns of its group of 8,
	// faulted in together so that they lie together: see colGroup), and stays so once reused.
	// A request's per-site vectors, one column per request and one cell per site, are the
	// intended use.
	Columns     int
	ColumnCells int
	CellBytes   int
	// UserConfig is up to UserConfigSize bytes stored in the immutable header, where every
	// process that opens the region can read it (Region.UserConfig).
	UserConfig []byte
}

func (c Config) withDefaults() (Config, error) {
	if c.IndexSlots == 0 {
		c.IndexSlots = DefaultIndexSlots
	}
	if c.ArenaBytes == 0 {
		c.ArenaBytes = DefaultArenaBytes
	}
	if c.ReaderSlots == 0 {
		c.ReaderSlots = DefaultReaderSlots
	}
	if c.MaxProbe == 0 {
		c.MaxProbe = min(DefaultMaxProbe, c.IndexSlots)
	}
	if c.MarkSlots == 0 {
		c.MarkSlots = DefaultMarkSlots
	}
	switch {
	case c.IndexSlots < minIndexSlots || c.IndexSlots > maxIndexSlots || bits.OnesCount(uint(c.IndexSlots)) != 1:
		return c, fmt.Errorf("%w: IndexSlots %d must be a power of two in [%d, %d]", ErrBadConfig, c.IndexSlots, minIndexSlots, maxIndexSlots)
	case c.ArenaBytes < minArenaBytes || c.ArenaBytes > maxArenaBytes || c.ArenaBytes%blobAlign != 0:
		return c, fmt.Errorf("%w: ArenaBytes %d must be a multiple of 64 in [%d, %d]", ErrBadConfig, c.ArenaBytes, minArenaBytes, int64(maxArenaBytes))
	case c.ReaderSlots < 1 || c.ReaderSlots > maxReaderSlots:
		return c, fmt.Errorf("%w: ReaderSlots %d must be in [1, %d]", ErrBadConfig, c.ReaderSlots, maxReaderSlots)
	case c.MarkSlots < minMarkSlots || c.MarkSlots > maxMarkSlots || bits.OnesCount(uint(c.MarkSlots)) != 1:
		return c, fmt.Errorf("%w: MarkSlots %d must be a power of two in [%d, %d]", ErrBadConfig, c.MarkSlots, minMarkSlots, maxMarkSlots)
	case c.MaxProbe < 1 || c.MaxProbe > c.IndexSlots:
		return c, fmt.Errorf("%w: MaxProbe %d must be in [1, IndexSlots]", ErrBadConfig, c.MaxProbe)
	case len(c.UserConfig) > UserConfigSize:
		return c, fmt.Errorf("%w: UserConfig is %d bytes, at most %d", ErrBadConfig, len(c.UserConfig), UserConfigSize)
	}
	return c, c.checkPool()
}

// checkPool validates the column pool's fields: all zero, or all set within the caps.
func (c Config) checkPool() error {
	switch {
	case c.Columns == 0 && c.ColumnCells == 0 && c.CellBytes == 0:
		return nil
	case c.Columns < 0 || c.ColumnCells < 0 || c.CellBytes < 0:
		return fmt.Errorf("%w: Columns %d, ColumnCells %d and CellBytes %d must not be negative", ErrBadConfig, c.Columns, c.ColumnCells, c.CellBytes)
	case c.Columns == 0 || c.ColumnCells == 0 || c.CellBytes == 0:
		return fmt.Errorf("%w: Columns %d, ColumnCells %d and CellBytes %d: set all three for a column pool, or none for no pool", ErrBadConfig, c.Columns, c.ColumnCells, c.CellBytes)
	case c.CellBytes%cellAlign != 0:
		return fmt.Errorf("%w: CellBytes %d must be a multiple of %d (round it up)", ErrBadConfig, c.CellBytes, cellAlign)
	case c.Columns > maxColumns:
		return fmt.Errorf("%w: Columns %d, at most %d", ErrBadConfig, c.Columns, maxColumns)
	case c.Columns > MaxColumns(c.ColumnCells, c.CellBytes):
		return fmt.Errorf("%w: a pool of %d columns of %d cells of %d bytes exceeds %d bytes; lower one of them", ErrBadConfig, c.Columns, c.ColumnCells, c.CellBytes, uint64(maxPoolBytes))
	}
	return nil
}

// MaxColumns is the most columns Config.Columns may give a pool of columns of columnCells
// cells of cellBytes bytes: the column cap (1 Mi) or what fits the pool's 64 GiB, whichever is
// lower; 0 when one column alone does not fit or a size is not positive. Create refuses more
// with ErrBadConfig; a configuration layer can check it first (steer.MaxColumns for a model).
func MaxColumns(columnCells, cellBytes int) int {
	if columnCells < 1 || cellBytes < 1 || uint64(cellBytes) > maxPoolBytes || uint64(columnCells) > maxPoolBytes/uint64(cellBytes) {
		return 0
	}
	return int(min(maxColumns, maxPoolBytes/(uint64(columnCells)*uint64(cellBytes))))
}

// Region is a mapped shmsteer region, in the owner (Create) or in a reader (Open). Its methods
// are safe for concurrent use by any number of goroutines.
type Region struct {
	l layout
	// *mapped holds every field that reaches the mapping (see mapped). Its fields are
	// promoted: r.data, r.arena, ... read as if they were Region's own.
	*mapped
	// lease is this Region's own open file description of the reader file (readers only): it
	// holds an OFD lock on every slot this Region claims, which the kernel drops when the
	// process ends, in whatever PID namespace it runs. The owner tests the locks to tell live
	// claimers from dead ones (see lease_linux.go).
	lease   *os.File
	me      uint64 // this Region's lease word, written in the slots it claims
	relaxed bool   // pins may use plain stores (see flagMembarrier)
	closed  atomic.Bool

	slotMu  sync.Mutex       // serializes claiming and releasing reader slots
	claimed map[uint64]bool  // every slot this process holds, for Close
	open    map[*Reader]bool // every open Reader, whose descriptor Close marks closed
	parked  bool             // Close left the mappings parked for open Readers (park)

	local  [maxLocalSlots]atomic.Uint64
	nlocal atomic.Int32
	// snapPins counts the open Snapshots pinning one of the local slots (not a Reader's): with
	// every local slot held by one, no slot frees up by waiting (see claimSlot).
	snapPins atomic.Int32

	w *writer // nil in readers
}

// mapped is everything of a Region that reaches the mapping, which holds every value (the key
// registry's keys among them). It sits behind a pointer so that no fmt verb prints a mapping's
// bytes: fmt's reflection dereferences a pointer at the top level only (also when it reports a
// bad verb for a pointer field, which it prints again from the top), so whatever struct holds a
// *Region, printing it reaches Region's fields at most, and this pointer prints as an address.
type mapped struct {
	data    []byte // whole data mapping: read-write in the owner, read-only in readers
	index   []byte
	marks   []byte
	arena   []byte
	pool    columnPool // the column pool (its bytes nil if the region has none)
	readers []byte     // reader slots, read-write everywhere
	maps    mappings
	files   [2]*os.File // owner only: the memfds, for passing to readers

	m rmem // what the generated reader reads (readerprim.go), without a pin word
}

// Create makes a new region backed by two sealed memfds, maps it read-write and returns it as
// its owner: the only process that may write it. Nothing is created on any file system.
func Create(cfg Config) (*Region, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	l := computeLayout(uint64(cfg.IndexSlots), uint64(cfg.MarkSlots), uint64(cfg.ArenaBytes), uint64(cfg.ReaderSlots), uint64(cfg.MaxProbe)).
		withPool(uint64(cfg.Columns), uint64(cfg.ColumnCells), uint64(cfg.CellBytes))
	var salt [24]byte
	if _, err := rand.Read(salt[:]); err != nil {
		return nil, fmt.Errorf("shmsteer: reading random salt: %w", err)
	}
	l.hashK0 = binary.LittleEndian.Uint64(salt[0:])
	l.hashK1 = binary.LittleEndian.Uint64(salt[8:])
	l.regionID = binary.LittleEndian.Uint64(salt[16:]) | 1

	me, err := newLeaseWord()
	if err != nil {
		return nil, err
	}
	if registerMembarrier() && globalBarrier() == nil {
		l.flags |= flagMembarrier
	}
	r := &Region{mapped: &mapped{}, l: l, me: me, relaxed: l.flags&flagMembarrier != 0, claimed: map[uint64]bool{}, open: map[*Reader]bool{}}
	if err := r.createFiles(); err != nil {
		return nil, err
	}
	writeHeader(r.data, l, uint64(os.Getpid()), uint64(time.Now().UnixNano()), cfg.UserConfig)
	le := binary.LittleEndian
	le.PutUint64(r.readers[rMagic:], readersMagic)
	le.PutUint64(r.readers[rSlots:], l.readerSlots)
	le.PutUint64(r.readers[rRegionID:], l.regionID)
	store64(r.data, hVersion, 1)
	store64(r.data, hHorizon, 1)
	r.slice()
	if err := r.seal(); err != nil {
		r.Close()
		return nil, err
	}
	r.w = newWriter(l)
	return r, nil
}

// Open maps a region from the two files the owner passed (Files), read-only for the data,
// after validating every header field against the files' sizes. The caller may close the files
// once Open returns.
func Open(data, readers *os.File) (*Region, error) {
	if data == nil || readers == nil {
		return nil, fmt.Errorf("%w: nil file", ErrNotRegion)
	}
	me, err := newLeaseWord()
	if err != nil {
		return nil, err
	}
	r := &Region{mapped: &mapped{}, me: me, claimed: map[uint64]bool{}, open: map[*Reader]bool{}}
	if err := r.openFiles(data, readers); err != nil {
		return nil, err
	}
	r.relaxed = r.l.flags&flagMembarrier != 0 && registerMembarrier()
	r.slice()
	return r, nil
}

func (r *Region) slice() {
	r.index = r.data[r.l.indexOff : r.l.indexOff+8*r.l.indexSlots : r.l.indexOff+8*r.l.indexSlots]
	mEnd := r.l.markOff + markEntry*r.l.markSlots
	r.marks = r.data[r.l.markOff:mEnd:mEnd]
	r.arena = r.data[r.l.arenaOff : r.l.arenaOff+r.l.arenaSize : r.l.arenaOff+r.l.arenaSize]
	if r.l.columns != 0 {
		pEnd := r.l.poolOff + r.l.poolBytes()
		r.pool = columnPool{bytes: r.data[r.l.poolOff:pEnd:pEnd], columns: r.l.columns, cells: r.l.columnCells, cellBytes: r.l.cellBytes}
	}
	m := &r.m
	m.version, m.horizon = word64(r.data, hVersion), word64(r.data, hHorizon)
	m.index, m.indexMask = words(r.index), r.l.mask()
	m.arena, m.arenaWords, m.arenaSize = r.arena, words(r.arena), uint64(len(r.arena))
	m.maxProbe = r.l.maxProbe
	m.hashK0, m.hashK1, m.hashK2 = r.l.hashK0, r.l.hashK1, hashK2(r.l.hashK0, r.l.hashK1)
	if r.relaxed {
		m.relaxed = 1
	}
	for k := range m.seeds {
		m.seeds[k] = kindSeed(r.l.hashK0, r.l.hashK1, uint64(k))
	}
}

// IsOwner reports whether this process created the region and may write it.
func (r *Region) IsOwner() bool { return r.w != nil }

// Files returns the owner's memfds, to pass to readers (cmd.ExtraFiles or SCM_RIGHTS). They stay
// owned by the region; readers get nil.
func (r *Region) Files() (data, readers *os.File) { return r.files[0], r.files[1] }

// ID is the region's random identity, the same in every process that maps it.
func (r *Region) ID() uint64 { return r.l.regionID }

// Version returns the last published version.
func (r *Region) Version() uint64 { return load64(r.data, hVersion) }

// OwnerPID is the pid of the process that created the region.
func (r *Region) OwnerPID() int { return int(binary.LittleEndian.Uint64(r.data[hOwnerPID:])) }

// UserConfig returns a copy of the bytes given as Config.UserConfig (zero-padded to
// UserConfigSize).
func (r *Region) UserConfig() []byte {
	return append([]byte(nil), r.data[hUserConfig:hUserConfig+UserConfigSize]...)
}

// Close releases this process's reader slots and unmaps the region. New reads fail with
// ErrClosed at once; Close waits up to closeWait for reads in flight and open snapshots of this
// process to finish, and if some are still open it returns ErrBusy and leaves the region
// mapped, so that no reader faults. While Readers of this process are still open, their
// address ranges stay reserved (park) until the last of them is closed. Closing the owner's region does not destroy what other
// processes still map: the memory goes with the last mapping.
func (r *Region) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	r.slotMu.Lock()
	for rd := range r.open {
		// A later Get reads this private memory, not the region: it finds no version and takes
		// the slow path, which sees the region closed. A Get that loaded the old one sees its
		// state word closed once it has read (Reader.Get), and then loads this one; the C
		// reader checks the same word, its descriptor's.
		old := rd.m.Swap(closedMem())
		setState(old.state, descClosed, true)
	}
	r.slotMu.Unlock()
	if r.w != nil {
		r.w.mu.Lock() // wait for a write in flight
		defer r.w.mu.Unlock()
	}
	if r.relaxed {
		globalBarrier() // make relaxed pin stores of our readers visible to the scan below
	}
	r.slotMu.Lock()
	defer r.slotMu.Unlock()
	for deadline := time.Now().Add(closeWait); ; time.Sleep(time.Millisecond) {
		busy := 0
		for s := range r.claimed {
			if load64(r.readers, s+slotPin) != 0 {
				busy++
			}
		}
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d read sections still open after %v", ErrBusy, busy, closeWait)
		}
	}
	for s := range r.claimed {
		r.releaseSlot(s)
	}
	// A Get of one of them may still read the mapping: unpinned where pinlessGet holds, and
	// where it does not, it loads the version word before its pin is stored (so the scan above
	// cannot see it). Their ranges stay mapped (park) until the last of them is closed.
	if len(r.open) > 0 {
		r.parked = true
		return r.park()
	}
	return r.unmap()
}

// closeWait bounds how long Close waits for open read sections (a variable for tests).
var closeWait = 5 * time.Second

// Stats is a point-in-time view of a region's counters.
type Stats struct {
	Version        uint64 // last published version
	Horizon        uint64 // oldest version a snapshot can still pin
	Entries        uint64 // live values
	IndexSlots     uint64
	ArenaBytes     uint64 // arena capacity
	AllocBytes     uint64 // arena bytes in use: live values, retired values, deletion markers
	LiveBytes      uint64 // arena bytes of live values
	RetiredBytes   uint64 // arena bytes waiting for readers to move on
	ReclaimedBytes uint64 // arena bytes reclaimed over the region's life
	Commits        uint64
	ReaderSlots    uint64
	ReadersClaimed uint64 // reader slots claimed by some process
	ReadersPinned  uint64 // reader slots inside a read section right now
	DeadCleared    uint64 // reader slots of dead processes cleared
	Marks          uint64 // marks present (Tx.Mark)
	MarkSlots      uint64 // mark table capacity
	MarkEntries    uint64 // mark entries in use: present, removed but still visible to a pin, or reclaimed
	Columns        uint64 // column pool capacity (Config.Columns; 0: no pool)
	ColumnsUsed    uint64 // columns not free: attached to values, or retired
	ColumnsRetired uint64 // columns retired and waiting for readers to move on
	// OldestPin is the reader slot pinned at the lowest version now, the one that holds
	// reclamation back; zero if no slot is pinned.
	OldestPin PinInfo
}

// PinInfo describes a pinned reader slot. A pin that stays for seconds belongs to a stuck
// process or a snapshot left open: ending that process frees its slots (the owner finds them
// within a second), closing the snapshot unpins it.
type PinInfo struct {
	Slot    int           // slot number
	PID     int           // the holder's pid as it sees itself (0: unknown); in a container this is a pid of the container's PID namespace
	Version uint64        // the pinned version
	Age     time.Duration // how long the owner has seen this pin held (0: not yet observed)
}

func (p PinInfo) String() string {
	if p.Version == 0 {
		return "no pin"
	}
	return fmt.Sprintf("reader slot %d (pid %d as the holder sees itself) pinned at version %d for %v", p.Slot, p.PID, p.Version, p.Age.Round(time.Millisecond))
}

// Stats reads the region's counters; any process may call it.
func (r *Region) Stats() Stats {
	s := Stats{
		Version:        load64(r.data, hVersion),
		Horizon:        load64(r.data, hHorizon),
		Entries:        load64(r.data, hEntries),
		IndexSlots:     r.l.indexSlots,
		ArenaBytes:     r.l.arenaSize,
		AllocBytes:     load64(r.data, hAllocBytes),
		LiveBytes:      load64(r.data, hLiveBytes),
		RetiredBytes:   load64(r.data, hRetiredBytes),
		ReclaimedBytes: load64(r.data, hReclaimed),
		Commits:        load64(r.data, hCommits),
		ReaderSlots:    r.l.readerSlots,
		DeadCleared:    load64(r.data, hDeadCleared),
		Marks:          load64(r.data, hMarks),
		MarkSlots:      r.l.markSlots,
		MarkEntries:    load64(r.data, hMarkEntries),
		Columns:        r.l.columns,
		ColumnsUsed:    load64(r.data, hColumnsUsed),
		ColumnsRetired: load64(r.data, hColumnsRetired),
	}
	hw := min(load64(r.readers, rHighWater), r.l.readerSlots)
	for i := uint64(0); i < hw; i++ {
		o := slotOff(i)
		if load64(r.readers, o+slotOwner) != 0 {
			s.ReadersClaimed++
			if pin := load64(r.readers, o+slotPin); pin != 0 {
				s.ReadersPinned++
				if s.OldestPin.Version == 0 || pin < s.OldestPin.Version {
					s.OldestPin = r.pinInfo(i, pin, time.Now())
				}
			}
		}
	}
	return s
}

// pinInfo describes slot i holding pin, with the age the owner's scans recorded.
func (r *Region) pinInfo(i, pin uint64, now time.Time) PinInfo {
	o := slotOff(i)
	p := PinInfo{Slot: int(i), PID: int(int32(load64(r.readers, o+slotPID))), Version: pin}
	if load64(r.readers, o+slotSeenPin) == pin {
		if since := int64(load64(r.readers, o+slotSeenSince)); since > 0 {
			p.Age = max(now.Sub(time.Unix(0, since)), 0)
		}
	}
	return p
}

func slotOff(i uint64) uint64 { return lineSize * (i + 1) }
