package shm

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/bits"
)

// LayoutVersion is the version of the binary layout this build reads and writes. 5: the index
// and mark hash ends in a final avalanche (keyHashFrom), so index positions moved and a region
// of layout 4 is refused with ErrIncompatible. 4: the header
// records a column pool's geometry (hPoolOff to hCellBytes) and its checksum moved after them;
// a region of layout 3 (no pool, the checksum where the pool's offset now is) is refused with
// ErrIncompatible. 3: the index and mark hash is keyHashFrom's two-lane form
// (internal/shmlayout/reader.go.in).
const LayoutVersion = 5

const (
	dataMagic    = 0x3130415441444d53 // "SMDATA01" little-endian
	readersMagic = 0x3130445245444d53 // "SMDERD01" little-endian

	headerSize = 4096

	// Header fields, byte offsets. The first line and a half is immutable after Create and
	// covered by the header checksum; the mutable words each have a cache line of their own
	// so readers polling the version do not share a line with counters the writer bumps.
	hMagic       = 0
	hLayout      = 8 // uint32 layout version | uint32 header size
	hTotalSize   = 16
	hIndexOff    = 24
	hIndexSlots  = 32
	hArenaOff    = 40
	hArenaSize   = 48
	hReaderSlots = 56
	hMaxProbe    = 64
	hHashK0      = 72
	hHashK1      = 80
	hRegionID    = 88
	hOwnerPID    = 96
	hOwnerStart  = 104
	hDeleteRes   = 112
	hFlags       = 120
	hMarkOff     = 128
	hMarkSlots   = 136
	// 144 to 175: the column pool's geometry (hPoolOff, hColumns, hColumnCells, hCellBytes:
	// layout_gen.go, from internal/shmlayout's table).
	hChecksum       = 176 // crc32c of bytes [0, 176) and of the user config
	hReclaimSeq     = 320 // odd while a reclamation pass runs
	hEntries        = 384 // live values (not deletion markers)
	hLiveBytes      = 392 // bytes of live blobs (heads of chains)
	hAllocBytes     = 400 // bytes allocated in the arena (live + retired + markers)
	hRetiredBytes   = 408 // bytes retired and waiting for readers to move on
	hCommits        = 416
	hReclaimed      = 424 // bytes reclaimed over the region's life
	hDeadCleared    = 432 // reader slots of dead processes cleared
	hMarks          = 440 // marks present at the last version
	hMarkEntries    = 448 // mark entries ever written and not yet empty (present, removed or tombstones)
	hColumnsUsed    = 456 // columns not free: reserved, live or retired (the owner's count at its last commit or pass)
	hColumnsRetired = 464 // columns retired and waiting for readers to move on

	// flagMembarrier: the owner fences every registered reader process with
	// membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) before it scans reader slots, so readers that
	// registered may pin with a plain store instead of a fenced one.
	flagMembarrier = 1
	hUserConfig    = 1024
	// UserConfigSize is the size of the immutable area of the header that the creator may fill
	// through Config.UserConfig (the steer layer records its model config there) and readers
	// can read through Region.UserConfig.
	UserConfigSize = 1024

	// Reader memfd layout: a header line, then one cache line per slot.
	rMagic     = 0
	rSlots     = 8
	rRegionID  = 16
	rHighWater = 24 // one past the highest slot ever claimed
	// A slot's words. The claimer writes owner, pin and pid; the owner process writes seenPin
	// and seenSince as it scans, so any process can tell how long a pin has been held.
	slotOwner     = 0  // the claimer's lease word (random, top bit set); 0 = free; clearing = being cleared
	slotPID       = 16 // the claimer's pid as it sees itself (informational: it may be in another PID namespace)
	slotSeenPin   = 24 // the pin the owner saw at its last scan
	slotSeenSince = 32 // unix nanoseconds when the owner first saw that pin
	clearingWord  = 1  // an owner word that no lease takes: the owner is clearing a dead claimer's slot

	// Mark entries: 32 bytes each (markEntry): tag, added version, removed version (0 = still
	// present), zero. A tag is never 0 (empty) or markTomb (a reclaimed entry, skipped by probes).
	markEntry    = 32
	markTag      = 0
	markAdded    = 8
	markRemoved  = 16
	markTomb     = ^uint64(0)
	maxMarkProbe = 128

	// MaxValueLen is the longest value a region stores (1 GiB).
	MaxValueLen = 1 << 30
	// maxChain bounds how many versions of one key a reader walks back; a longer chain is
	// corruption (the writer never keeps more versions than the pinned readers need, and a
	// reader giving up on a long chain only costs it ErrCorrupt).
	maxChain = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// layout is the validated geometry of a region, copied out of the header once at open.
type layout struct {
	totalSize   uint64
	indexOff    uint64
	indexSlots  uint64
	arenaOff    uint64
	arenaSize   uint64
	readerSlots uint64
	maxProbe    uint64
	hashK0      uint64
	hashK1      uint64
	regionID    uint64
	deleteRes   uint64
	flags       uint64
	markOff     uint64
	markSlots   uint64
	// The column pool (all zero: none).
	poolOff     uint64
	columns     uint64
	columnCells uint64
	cellBytes   uint64
}

// poolBytes is the column pool's size.
func (l *layout) poolBytes() uint64 { return l.columns * l.columnCells * l.cellBytes }

func (l *layout) mask() uint64 { return l.indexSlots - 1 }

// readersSize is the size of the reader memfd for n slots.
func readersSize(n uint64) uint64 { return lineSize * (n + 1) }

// computeLayout places the sections for a validated config.
func computeLayout(indexSlots, markSlots, arenaBytes, readerSlots, maxProbe uint64) layout {
	indexOff := uint64(headerSize)
	markOff := alignUp(indexOff+8*indexSlots, 4096)
	arenaOff := alignUp(markOff+markEntry*markSlots, 4096)
	return layout{
		markOff:     markOff,
		markSlots:   markSlots,
		totalSize:   arenaOff + arenaBytes,
		indexOff:    indexOff,
		indexSlots:  indexSlots,
		arenaOff:    arenaOff,
		arenaSize:   arenaBytes,
		readerSlots: readerSlots,
		maxProbe:    maxProbe,
		deleteRes:   deleteReserve(arenaBytes),
	}
}

// withPool places a column pool of a validated geometry after the arena, poolAlign-aligned.
func (l layout) withPool(columns, cells, cellBytes uint64) layout {
	if columns == 0 {
		return l
	}
	l.poolOff = alignUp(l.arenaOff+l.arenaSize, poolAlign)
	l.columns, l.columnCells, l.cellBytes = columns, cells, cellBytes
	l.totalSize = l.poolOff + l.poolBytes()
	return l
}

// deleteReserve is the arena space that only deletion markers may use, so a full region can
// always be emptied.
func deleteReserve(arenaBytes uint64) uint64 {
	r := arenaBytes / 64
	if r > 1<<20 {
		r = 1 << 20
	}
	return alignDown(r, blobAlign)
}

// writeHeader fills the immutable header fields and the checksum.
func writeHeader(h []byte, l layout, ownerPID, ownerStart uint64, userConfig []byte) {
	le := binary.LittleEndian
	le.PutUint64(h[hMagic:], dataMagic)
	le.PutUint64(h[hLayout:], LayoutVersion|headerSize<<32)
	le.PutUint64(h[hTotalSize:], l.totalSize)
	le.PutUint64(h[hIndexOff:], l.indexOff)
	le.PutUint64(h[hIndexSlots:], l.indexSlots)
	le.PutUint64(h[hArenaOff:], l.arenaOff)
	le.PutUint64(h[hArenaSize:], l.arenaSize)
	le.PutUint64(h[hReaderSlots:], l.readerSlots)
	le.PutUint64(h[hMaxProbe:], l.maxProbe)
	le.PutUint64(h[hHashK0:], l.hashK0)
	le.PutUint64(h[hHashK1:], l.hashK1)
	le.PutUint64(h[hRegionID:], l.regionID)
	le.PutUint64(h[hOwnerPID:], ownerPID)
	le.PutUint64(h[hOwnerStart:], ownerStart)
	le.PutUint64(h[hDeleteRes:], l.deleteRes)
	le.PutUint64(h[hFlags:], l.flags)
	le.PutUint64(h[hMarkOff:], l.markOff)
	le.PutUint64(h[hMarkSlots:], l.markSlots)
	le.PutUint64(h[hPoolOff:], l.poolOff)
	le.PutUint64(h[hColumns:], l.columns)
	le.PutUint64(h[hColumnCells:], l.columnCells)
	le.PutUint64(h[hCellBytes:], l.cellBytes)
	copy(h[hUserConfig:hUserConfig+UserConfigSize], userConfig)
	le.PutUint64(h[hChecksum:], uint64(headerChecksum(h)))
}

// headerChecksum covers the immutable words before hChecksum and the user config.
func headerChecksum(h []byte) uint32 {
	c := crc32.Checksum(h[:hChecksum], castagnoli)
	return crc32.Update(c, castagnoli, h[hUserConfig:hUserConfig+UserConfigSize])
}

// parseHeader validates a data header against the size of the file it came from. It reads
// only the immutable fields, so it may run on a live mapping; it never panics, whatever h holds.
func parseHeader(h []byte, fileSize uint64) (layout, error) {
	var l layout
	if len(h) < headerSize || fileSize < headerSize {
		return l, fmt.Errorf("%w: %d bytes, need at least %d", ErrNotRegion, min(uint64(len(h)), fileSize), headerSize)
	}
	le := binary.LittleEndian
	if le.Uint64(h[hMagic:]) != dataMagic {
		return l, fmt.Errorf("%w: bad magic", ErrNotRegion)
	}
	lv := le.Uint64(h[hLayout:])
	if uint32(lv) != LayoutVersion {
		return l, fmt.Errorf("%w: region has layout %d, this build reads %d", ErrIncompatible, uint32(lv), LayoutVersion)
	}
	if lv>>32 != headerSize {
		return l, fmt.Errorf("%w: header size %d", ErrCorrupt, lv>>32)
	}
	if got, want := uint32(le.Uint64(h[hChecksum:])), headerChecksum(h); le.Uint64(h[hChecksum:])>>32 != 0 || got != want {
		return l, fmt.Errorf("%w: header checksum mismatch", ErrCorrupt)
	}
	l = layout{
		totalSize:   le.Uint64(h[hTotalSize:]),
		indexOff:    le.Uint64(h[hIndexOff:]),
		indexSlots:  le.Uint64(h[hIndexSlots:]),
		arenaOff:    le.Uint64(h[hArenaOff:]),
		arenaSize:   le.Uint64(h[hArenaSize:]),
		readerSlots: le.Uint64(h[hReaderSlots:]),
		maxProbe:    le.Uint64(h[hMaxProbe:]),
		hashK0:      le.Uint64(h[hHashK0:]),
		hashK1:      le.Uint64(h[hHashK1:]),
		regionID:    le.Uint64(h[hRegionID:]),
		deleteRes:   le.Uint64(h[hDeleteRes:]),
		flags:       le.Uint64(h[hFlags:]),
		markOff:     le.Uint64(h[hMarkOff:]),
		markSlots:   le.Uint64(h[hMarkSlots:]),
		poolOff:     le.Uint64(h[hPoolOff:]),
		columns:     le.Uint64(h[hColumns:]),
		columnCells: le.Uint64(h[hColumnCells:]),
		cellBytes:   le.Uint64(h[hCellBytes:]),
	}
	if err := l.check(fileSize); err != nil {
		return layout{}, err
	}
	return l, nil
}

// check validates the geometry: sections in order, inside the file, aligned, sizes in range.
func (l *layout) check(fileSize uint64) error {
	bad := func(what string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(what, args...))
	}
	switch {
	case l.totalSize != fileSize:
		return bad("header says %d bytes, file has %d", l.totalSize, fileSize)
	case l.indexOff != headerSize:
		return bad("index offset %d", l.indexOff)
	case l.indexSlots < minIndexSlots || l.indexSlots > maxIndexSlots || bits.OnesCount64(l.indexSlots) != 1:
		return bad("index slots %d", l.indexSlots)
	case l.markOff != alignUp(l.indexOff+8*l.indexSlots, 4096):
		return bad("mark offset %d", l.markOff)
	case l.markSlots < minMarkSlots || l.markSlots > maxMarkSlots || bits.OnesCount64(l.markSlots) != 1:
		return bad("mark slots %d", l.markSlots)
	case l.arenaOff != alignUp(l.markOff+markEntry*l.markSlots, 4096):
		return bad("arena offset %d", l.arenaOff)
	case l.arenaSize < minArenaBytes || l.arenaSize > maxArenaBytes || l.arenaSize%blobAlign != 0:
		return bad("arena size %d", l.arenaSize)
	case l.columns == 0 && (l.poolOff != 0 || l.columnCells != 0 || l.cellBytes != 0):
		return bad("column pool at %d with %d columns of %d cells of %d bytes", l.poolOff, l.columns, l.columnCells, l.cellBytes)
	case l.columns == 0 && l.arenaOff+l.arenaSize != l.totalSize:
		return bad("arena end %d != size %d", l.arenaOff+l.arenaSize, l.totalSize)
	case l.columns != 0:
		if err := l.checkPool(); err != nil {
			return err
		}
	case l.readerSlots < 1 || l.readerSlots > maxReaderSlots:
		return bad("reader slots %d", l.readerSlots)
	case l.maxProbe < 1 || l.maxProbe > l.indexSlots:
		return bad("max probe %d", l.maxProbe)
	case l.deleteRes != deleteReserve(l.arenaSize):
		return bad("delete reserve %d", l.deleteRes)
	case l.flags&^flagMembarrier != 0:
		return bad("unknown flags %#x", l.flags)
	}
	return nil
}

// checkPool validates a column pool's geometry: sizes in range (so their product cannot
// overflow), the pool right after the arena at its alignment and ending the file.
func (l *layout) checkPool() error {
	bad := func(what string, args ...any) error {
		return fmt.Errorf("%w: column pool: %s", ErrCorrupt, fmt.Sprintf(what, args...))
	}
	switch {
	case l.columns > maxColumns || l.columnCells < 1 || l.columnCells > maxPoolBytes/cellAlign ||
		l.cellBytes < cellAlign || l.cellBytes%cellAlign != 0 || l.cellBytes > maxPoolBytes:
		return bad("%d columns of %d cells of %d bytes", l.columns, l.columnCells, l.cellBytes)
	case l.columns*l.columnCells > maxPoolBytes/l.cellBytes:
		return bad("%d columns of %d cells of %d bytes exceed %d bytes", l.columns, l.columnCells, l.cellBytes, uint64(maxPoolBytes))
	case l.poolOff != alignUp(l.arenaOff+l.arenaSize, poolAlign):
		return bad("offset %d", l.poolOff)
	case l.poolOff+l.poolBytes() != l.totalSize:
		return bad("end %d != size %d", l.poolOff+l.poolBytes(), l.totalSize)
	}
	return nil
}

// parseReaders validates the reader memfd's header against the data header.
func parseReaders(r []byte, fileSize uint64, l *layout) error {
	if len(r) < lineSize || fileSize < lineSize {
		return fmt.Errorf("%w: reader file too small", ErrNotRegion)
	}
	le := binary.LittleEndian
	if le.Uint64(r[rMagic:]) != readersMagic {
		return fmt.Errorf("%w: bad reader file magic", ErrNotRegion)
	}
	if le.Uint64(r[rRegionID:]) != l.regionID {
		return fmt.Errorf("%w: reader file belongs to another region", ErrCorrupt)
	}
	if n := le.Uint64(r[rSlots:]); n != l.readerSlots || fileSize != readersSize(n) || uint64(len(r)) < readersSize(n) {
		return fmt.Errorf("%w: reader file has %d slots in %d bytes, header says %d", ErrCorrupt, n, fileSize, l.readerSlots)
	}
	return nil
}

func alignUp(n, a uint64) uint64   { return (n + a - 1) &^ (a - 1) }
func alignDown(n, a uint64) uint64 { return n &^ (a - 1) }

// blobSize is the arena footprint of a blob with the given key and value lengths.
func blobSize(keyLen, valueLen int) uint64 {
	return alignUp(valueOffset(keyLen, valueLen)+uint64(valueLen), blobAlign)
}

// valueOffset is where a blob's value starts, after the header and key: 64-byte aligned for
// values of 64 bytes or more, so float vectors are aligned for SIMD, and 8-byte aligned for
// smaller ones, so a small value shares a cache line with its key.
func valueOffset(keyLen, valueLen int) uint64 {
	if valueLen >= smallValue {
		return alignUp(bKey+uint64(keyLen), blobAlign)
	}
	return alignUp(bKey+uint64(keyLen), smallAlign)
}

// blob is a decoded, bounds-checked blob header. Offsets are relative to the arena.
type blob struct {
	off      uint64
	size     uint64
	kind     Kind
	flags    uint16
	keyLen   uint64
	valueLen uint64
	valueOff uint64 // absolute within the arena
	version  uint64
	prev     uint64 // unit+1, 0 = none
	sum      uint32
}

func (b *blob) key(arena []byte) []byte { return arena[b.off+bKey : b.off+bKey+b.keyLen] }
func (b *blob) value(arena []byte) []byte {
	return arena[b.valueOff : b.valueOff+b.valueLen : b.valueOff+b.valueLen]
}
func (b *blob) deleted() bool { return b.flags&flagDeleted != 0 }

// readBlob decodes the blob at arena offset off with atomic loads and checks that every
// offset and length stays inside the arena and agrees with the others.
func readBlob(arena []byte, off uint64) (blob, error) {
	var b blob
	if off%blobAlign != 0 || off > uint64(len(arena)) || uint64(len(arena))-off < blobAlign {
		return b, fmt.Errorf("%w: blob offset %d outside arena", ErrCorrupt, off)
	}
	meta := load64(arena, off+bMeta)
	lens := load64(arena, off+bLens)
	sum := load64(arena, off+bSum)
	b = blob{
		off:      off,
		size:     uint64(uint32(meta)) * blobAlign,
		kind:     Kind(meta >> 32),
		flags:    uint16(meta >> 48),
		keyLen:   uint64(uint32(lens)),
		valueLen: lens >> 32,
		valueOff: off + sum>>32,
		version:  load64(arena, off+bVersion),
		prev:     load64(arena, off+bPrev),
		sum:      uint32(sum),
	}
	switch {
	case b.size < blobAlign || b.size > uint64(len(arena))-off:
		return b, fmt.Errorf("%w: blob at %d has size %d", ErrCorrupt, off, b.size)
	case b.keyLen == 0 || b.keyLen > MaxKeyLen || sum>>32 != valueOffset(int(b.keyLen), int(b.valueLen)):
		return b, fmt.Errorf("%w: blob at %d has key length %d", ErrCorrupt, off, b.keyLen)
	case b.valueLen > b.size-(sum>>32):
		return b, fmt.Errorf("%w: blob at %d has value length %d", ErrCorrupt, off, b.valueLen)
	case b.kind == 0 || b.version == 0 || b.flags&^flagDeleted != 0:
		return b, fmt.Errorf("%w: blob at %d has bad kind/version/flags", ErrCorrupt, off)
	}
	return b, nil
}

// verify checks the blob's content checksum.
func (b *blob) verify(arena []byte) error {
	c := crc32.Checksum(b.key(arena), castagnoli)
	c = crc32.Update(c, castagnoli, b.value(arena))
	if c != b.sum {
		return fmt.Errorf("%w: blob at %d fails its checksum", ErrCorrupt, b.off)
	}
	return nil
}

// writeBlobHeader writes a blob's header and key; the caller writes the value at
// off+valueOffset(len(key), valueLen) and then calls sealBlob.
func writeBlobHeader(arena []byte, off uint64, kind Kind, flags uint16, key []byte, valueLen int, version, prev uint64) {
	size := blobSize(len(key), valueLen)
	store64(arena, off+bMeta, size/blobAlign|uint64(kind)<<32|uint64(flags)<<48)
	store64(arena, off+bLens, uint64(len(key))|uint64(valueLen)<<32)
	store64(arena, off+bVersion, version)
	store64(arena, off+bPrev, prev)
	copy(arena[off+bKey:], key)
}

// sealBlob computes the checksum of a filled blob and stores it with the value offset.
func sealBlob(arena []byte, off uint64, keyLen, valueLen int) {
	vo := valueOffset(keyLen, valueLen)
	c := crc32.Checksum(arena[off+bKey:off+bKey+uint64(keyLen)], castagnoli)
	c = crc32.Update(c, castagnoli, arena[off+vo:off+vo+uint64(valueLen)])
	store64(arena, off+bSum, uint64(c)|vo<<32)
}

// indexWord packs a blob's arena offset and the key's hash fingerprint.
func indexWord(hash, off uint64) uint64 { return (hash>>32)<<32 | (off/blobAlign + 1) }

// wordOffset unpacks an index word's arena offset; ok is false for empty and tombstone words.
func wordOffset(w uint64) (off uint64, ok bool) {
	if w == 0 || w == tombstone {
		return 0, false
	}
	return (uint64(uint32(w)) - 1) * blobAlign, uint32(w) != 0
}
