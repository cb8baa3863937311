// Package shm owns the shared-memory region that every shmsteer process reads: its binary
// layout, the open-addressing index, the arena of immutable blobs, the column pool, versions and
// snapshots, and epoch-based reclamation through reader slots.
//
// It must not know keys, requests or steering (it stores opaque values under (Kind, key)) and
// must not import the rest of shmsteer; which Kind means what is internal/proto's table.
//
// To start: one process, the owner, creates a region (Create) and is its only writer (Put,
// Delete, Update for a transaction); writes are serialized by an in-process mutex, so no
// cross-process lock can be left held by a dead process. Any number of processes open the
// region from its two file descriptors (Files, then Open) and read it lock-free (Get, a Reader,
// or a Snapshot). Regions need Linux (memfd, file seals, OFD locks, membarrier); elsewhere the
// package builds and Create and Open return ErrUnsupported (region_other.go).
//
// # Layout (v4)
//
// A region is two memfds. The data memfd holds, in order: a 4 KiB header, the index (a
// power-of-two array of 64-bit words), the mark table, the arena of 64-byte-aligned blobs and,
// if the region has one (Config.Columns, ColumnCells, CellBytes), the column pool. The pool
// starts at a 2 MiB boundary of the memfd after the arena and is cell-major: cell c of column
// k is at (c*Columns + k)*CellBytes from its start, so cell c of adjacent columns is adjacent
// (a request's per-site vectors in one column each, a site's vectors of every request side by
// side for the decode step's gather). Its geometry is in the header, checked against the
// memfd's size by Open. Nothing touches the pool before the owner writes a cell, so an unused
// pool costs address space only; a cell becomes resident when the owner writes it (or a reader
// reads it), and stays so. After the owner
// maps it, the data memfd is sealed (F_SEAL_FUTURE_WRITE), so readers can map it read-only: a
// buggy reader cannot corrupt what every other process reads. The reader memfd holds the reader
// slots, one cache line each, which readers write to announce the version they read at.
//
// # Consistency
//
// Every write is copy-on-write: the writer fills a new blob whose header records its version and
// the offset of the blob it replaces, then links it with one atomic store of an index word and
// publishes the new global version with another. A reader pins the current version in its slot,
// follows an index word to the newest blob whose version is not above its pin, and so sees
// every write of a transaction or none of it. A replaced blob is retired at the version that
// replaced it and reused only when every pinned slot is at or above that version; slots of dead
// processes are found and cleared, so a crashed reader never blocks reclamation for long.
// A deleted key's index word becomes a tombstone once every reader has seen its deletion; the
// tombstones that no live key's probe path crosses are emptied again (tombstones.go), so a
// region that has stored and deleted millions of keys still answers a miss in a few words.
//
// A column lives as long as the value it is attached to. The owner reserves it in a
// transaction (Tx.AllocColumn), writes its cells in place (Tx.Cell) and ties it to a value the
// same transaction writes (Tx.Attach); a column left unattached at commit, or reserved by an
// aborted transaction, is freed at once, since no published value names it. When a later
// transaction replaces or deletes the value, its columns are retired at that version with its
// blob and reused by the same rule: once every pin is at or above it. A reused column is
// zeroed where earlier values wrote and the new one does not, so it holds exactly what its new
// value wrote (no pass writes a column, and no cell is zeroed that was never written). So a
// reader may read a column named by a value visible at its pinned version (Region.Columns) and
// finds it unchanged while the pin holds; a column no such value names means nothing to it. Which column is whose lives in the owner's private memory, like the
// arena's allocator.
//
// # Reader liveness
//
// A slot is tied to its claimer by an OFD lock on the slot's bytes of the reader file, taken
// through a file description the claimer opened privately; the kernel drops it when the
// process ends, in whatever PID namespace it runs (containers), and the owner tests it with
// F_OFD_GETLK (lease_linux.go). Pids are recorded for operators only. The owner also notes
// when it first saw each pin, so Stats.OldestPin names a stuck reader (pid, version, age) and
// an ErrRegionFull it causes says so.
//
// # Marks
//
// A mark is a key without a value, visible from one version to another, that costs a 32-byte
// entry of a table apart from the index and arena (marks.go): the key registry's revoked
// sentinels, which must always fit and may number hundreds of thousands.
//
// # Reading fast
//
// A pin must be ordered before the reader's next load (a store-load fence: XCHG on amd64), which
// would cost more than the whole lookup. So the owner, once per reclamation
// pass, runs membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) between raising the horizon and
// scanning the slots, and reader processes that registered for it pin with a plain store (an
// asymmetric fence, as userspace RCU does): the rare writer pays for the frequent readers. Where
// membarrier is unavailable the header says so and every pin is fenced. A Reader (NewReader)
// owns its slot, so its Get needs no compare-and-swap either; Region.Get shares a pool of slots
// between goroutines and takes one with a CAS. On amd64 a Reader's Get stores nothing at all:
// it reads at the current version unpinned and validates the copy afterwards, as a seqlock
// reader does (a pass raises the horizon before it frees anything, and TSO keeps the loads in
// order); a copy that fails is read again pinned. Region.Close leaves the address ranges of a
// region whose Readers are still open mapped to private zero pages (park), so such a Get never
// faults. The index hash is a keyed multiply-fold hash in
// two independent lanes (keyHashFrom) rather than SipHash, which alone would cost more than the
// lookup.
//
// # One reader, in Go and in C
//
// The hash, the pin and the probe loop with its bounds checks (getAt) are written once,
// in internal/shmlayout/reader.go.in: `go generate ./shm` renders that source verbatim into
// reader_gen.go, which Reader.Get and Region.Get call, and translates it into the C reader of
// capi/shmread_gen.h, with which libshmsteer.so (capi) reads keys without entering the Go
// runtime. Each language writes only the primitives the source calls (readerprim.go here, an
// atomic load of an index or arena word at a checked offset, the key compare, the multiply),
// and the layout's constants come from the same table (layout_gen.go). A Reader hands the C
// reader a descriptor (Reader.Descriptor: the image of its rmem, its pin word and the region's
// geometry, in process-local memory outside the Go heap, desc.go) whose state word Close marks,
// as the Go reader checks closed. The C reader answers only getAt's resFound and leaves the
// rest to Go.
//
// Every shared word is read and written with sync/atomic (or, for relaxed stores, an aligned
// MOV in relaxed_amd64.s); every offset and length read from the
// mapping is bounds-checked, so a corrupt region yields ErrCorrupt, never a fault. All of this
// package's pointer conversions live in unsafe.go.
package shm

// The layout constants and the reader that Go and C share (internal/shmlayout) are generated.
//go:generate go run layoutgen.go
