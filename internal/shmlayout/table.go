// Package shmlayout is the region layout's one table and its one reader, for the two languages
// that read a region: the Go reader of package shm and the C reader compiled into
// libshmsteer.so (capi), which C and Python call per key without entering the Go runtime. The
// table holds every offset, size and constant the readers use (header words, reader-slot words,
// blob header fields, the index word's format, the hash's constants, the reader's results) and
// the reader descriptor, the process-local record through which shm hands a Reader's geometry
// and pin word to C. The reader (reader.go.in) is the hash, the pin and the probe loop with its
// bounds checks, written once in a small subset of Go.
//
// It owns the table (Groups), the reader's source, its translation to C (toC) and the rendering
// (Outputs) of shm/layout_gen.go (the Go constants), shm/reader_gen.go (the reader's source
// itself) and capi/shmread_gen.h (the same constants as C macros, the C primitives of
// reader.c.in, the reader translated, and the C ABI's entry around it). Neither language
// writes a line of the reader's logic by hand: each writes only the primitives the source calls
// (shm/readerprim.go, reader.c.in). RefKeyHash is the hash written a second way, the oracle of
// the hash's tests. It must not be imported by shm itself (shm stays a leaf package: the
// generated files hold what it needs) and it builds nothing.
//
// To change the layout or the reader: edit a row or reader.go.in here, run `go generate ./shm`
// (shm/layoutgen.go), and bump shm.LayoutVersion when the bytes in the mapping (or where the hash
// puts them) change. TestLayoutGenerated fails while a generated file is stale and
// TestReaderOneSource while either reader holds logic not from the source; capi's TestFastReader*
// tests hold the two readers to the same answers, across processes and under concurrent writes,
// and the hash tests (shm's and capi's) to RefKeyHash.
package shmlayout

// Const is one row: a constant the Go and C readers both use.
type Const struct {
	Go  string // the Go constant's name in package shm
	C   string // the C macro's name (SHM_ prefix)
	Val uint64
	Doc string
}

// Group is a block of related rows, rendered as one const block.
type Group struct {
	Doc  string
	Rows []Const
}

// Groups is the table.
var Groups = []Group{
	{"Header words that a read loads, byte offsets into the data mapping. Each mutable word has a cache line of its own.", []Const{
		{"hVersion", "SHM_H_VERSION", 192, "global version, published last by every commit"},
		{"hHorizon", "SHM_H_HORIZON", 256, "oldest version whose data is guaranteed intact"},
	}},
	{"The column pool's geometry: immutable header words, byte offsets into the data mapping, covered by the header checksum. The pool is cell-major: cell c of column k is at poolOff + (c*columns + k)*cellBytes, so cell c of adjacent columns is adjacent. (The key reader reads none of them; they are here for any reader of columns, in either language.)", []Const{
		{"hPoolOff", "SHM_H_POOL_OFF", 144, "the pool's offset in the data memfd, a multiple of poolAlign, after the arena; 0 = no pool"},
		{"hColumns", "SHM_H_COLUMNS", 152, "number of columns; 0 = no pool"},
		{"hColumnCells", "SHM_H_COLUMN_CELLS", 160, "cells per column"},
		{"hCellBytes", "SHM_H_CELL_BYTES", 168, "bytes per cell, a positive multiple of cellAlign"},
		{"poolAlign", "SHM_POOL_ALIGN", 2 << 20, "the pool's alignment within the data memfd"},
		{"cellAlign", "SHM_CELL_ALIGN", 64, "cells are a multiple of this size, so every cell is this aligned"},
	}},
	{"Reader slots: one cache line each in the reader memfd, after a header line.", []Const{
		{"lineSize", "SHM_LINE", 64, "a cache line: the reader file's header and each slot"},
		{"slotPin", "SHM_SLOT_PIN", 8, "a slot's pinned version; 0 = not reading"},
	}},
	{"Index words: 0 = empty, tombstone = deleted and unlinked, else fingerprint<<indexFPShift | (unit+1), where unit is the blob's arena offset in blobAlign units and the fingerprint the top 32 bits of the key's hash. A key's probe sequence is hash, hash+1, ... (mod the index size), at most the header's max probe words, ending at an empty word.", []Const{
		{"tombstone", "SHM_TOMBSTONE", ^uint64(0), "an index word whose blob was unlinked"},
		{"indexFPShift", "SHM_INDEX_FP_SHIFT", 32, "where an index word's fingerprint starts"},
	}},
	{"Blob header, offsets within the blob. meta: uint32 size in units | uint16 kind << metaKindShift | uint16 flags << metaFlagsShift; lens: uint32 key length | uint32 value length << 32; sum: uint32 crc32c(key || value) | uint32 value offset << 32.", []Const{
		{"bMeta", "SHM_B_META", 0, "size, kind and flags"},
		{"bLens", "SHM_B_LENS", 8, "key and value lengths"},
		{"bVersion", "SHM_B_VERSION", 16, "version that published this blob"},
		{"bPrev", "SHM_B_PREV", 24, "unit+1 of the blob this one replaced; 0 = none"},
		{"bSum", "SHM_B_SUM", 32, "checksum and value offset"},
		{"bKey", "SHM_B_KEY", 40, "the key's first byte"},
		{"metaKindShift", "SHM_META_KIND_SHIFT", 32, "where meta's kind starts"},
		{"metaFlagsShift", "SHM_META_FLAGS_SHIFT", 48, "where meta's flags start"},
		{"kindMask", "SHM_KIND_MASK", 0xffff, "meta's kind, once shifted down"},
		{"lensValueShift", "SHM_LENS_VALUE_SHIFT", 32, "where lens's value length starts"},
		{"sumValueShift", "SHM_SUM_VALUE_SHIFT", 32, "where sum's value offset starts"},
		{"blobAlign", "SHM_BLOB_ALIGN", 64, "blobs start and end on this alignment; also the value alignment of values of at least smallValue bytes"},
		{"smallValue", "SHM_SMALL_VALUE", 64, "values shorter than this start smallAlign-aligned after the key, sharing its cache line"},
		{"smallAlign", "SHM_SMALL_ALIGN", 8, "the value alignment of values shorter than smallValue"},
		{"flagDeleted", "SHM_FLAG_DELETED", 1, "the blob is a deletion marker: the key has no value from its version on"},
		{"MaxKeyLen", "SHM_MAX_KEY_LEN", 1024, "the longest key a region stores"},
	}},
	{"The index hash (keyHash, in reader.go.in): a keyed multiply-fold hash in two lanes; kindSeed(k0, k1, kind) is kept per kind below seededKinds.", []Const{
		{"prime0", "SHM_PRIME0", 0xa0761d6478bd642f, ""},
		{"prime1", "SHM_PRIME1", 0xe7037ed1a0b428db, ""},
		{"prime2", "SHM_PRIME2", 0x8ebc6af09c88c6e3, ""},
		{"prime3", "SHM_PRIME3", 0x589965cc75374cc3, ""},
		{"seededKinds", "SHM_SEEDED_KINDS", 64, "kinds whose hash seed a Region (and a reader descriptor) keeps"},
	}},
	{"getAt's results (reader.go.in).", []Const{
		{"resMiss", "SHM_RES_MISS", 0, "the probe ended without the key"},
		{"resFound", "SHM_RES_FOUND", 1, "the value's arena offset and length"},
		{"resOlder", "SHM_RES_OLDER", 2, "the newest blob is above the pinned version, or a deletion marker: the general path walks the chain"},
		{"resBadKey", "SHM_RES_BAD_KEY", 3, "kind 0, or a key of a bad length"},
		{"resCorrupt", "SHM_RES_CORRUPT", 4, "an index word or blob that does not check out"},
		{"resRetry", "SHM_RES_RETRY", 5, "the version getAt pinned is below the horizon, or the reader is closed or busy"},
	}},
	{"The reader descriptor: process-local memory (never the mapping, never the Go heap) that a Reader fills for the C reader. Words at these byte offsets; addresses are of this process's mappings.", []Const{
		{"dState", "SHM_D_STATE", 0, "0 = usable; else descClosed and/or descBusy"},
		{"dPin", "SHM_D_PIN", 8, "address of the Reader's pin word"},
		{"dVersion", "SHM_D_VERSION", 16, "address of the header's version word"},
		{"dHorizon", "SHM_D_HORIZON", 24, "address of the header's horizon word"},
		{"dIndex", "SHM_D_INDEX", 32, "address of the index"},
		{"dIndexMask", "SHM_D_INDEX_MASK", 40, "index slots - 1"},
		{"dArena", "SHM_D_ARENA", 48, "address of the arena"},
		{"dArenaSize", "SHM_D_ARENA_SIZE", 56, "arena bytes"},
		{"dMaxProbe", "SHM_D_MAX_PROBE", 64, "the header's max probe"},
		{"dHashK1", "SHM_D_HASH_K1", 72, "the salt's second word"},
		{"dRelaxed", "SHM_D_RELAXED", 80, "1: pins may be plain stores (the owner fences with membarrier)"},
		{"dHashK0", "SHM_D_HASH_K0", 88, "the salt's first word (the hash of kinds from seededKinds on)"},
		{"dHashK2", "SHM_D_HASH_K2", 96, "hashK2 of the salt"},
		{"dSeeds", "SHM_D_SEEDS", 128, "seededKinds words: kindSeed of each kind"},
		{"descSize", "SHM_D_SIZE", 640, "the descriptor's size: dSeeds + 8*seededKinds"},
		{"descClosed", "SHM_D_CLOSED", 1, "dState bit: the Reader or its Region is closed"},
		{"descBusy", "SHM_D_BUSY", 2, "dState bit: a Snapshot of the Reader is open"},
	}},
}
