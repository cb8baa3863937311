package shm

import "errors"

var (
	// ErrNotFound means no live value is stored under the kind and key at the version read.
	ErrNotFound = errors.New("shmsteer: not found")
	// ErrRegionFull means the arena, the index or the mark table has no room for the write;
	// nothing was changed. The message says which part is full, how full, and which Config
	// field to raise; when reclamation is held back by a reader's pin it names that reader.
	ErrRegionFull = errors.New("shmsteer: region full")
	// ErrKeyTooLong means a key is empty or longer than MaxKeyLen bytes.
	ErrKeyTooLong = errors.New("shmsteer: key empty or too long")
	// ErrBadKind means kind 0 was used; it is reserved.
	ErrBadKind = errors.New("shmsteer: kind 0 is reserved")
	// ErrBadConfig means a Config field is out of range; the message names it.
	ErrBadConfig = errors.New("shmsteer: bad region config")
	// ErrNotRegion means the file is not a shmsteer region (wrong magic or too small).
	ErrNotRegion = errors.New("shmsteer: not a shmsteer region")
	// ErrIncompatible means the region was written with a layout version this build cannot
	// read; run the same shmsteer version in every process.
	ErrIncompatible = errors.New("shmsteer: incompatible region layout")
	// ErrCorrupt means a header, index word or blob read from the mapping failed validation.
	// The region cannot be trusted; recreate it.
	ErrCorrupt = errors.New("shmsteer: region corrupt")
	// ErrReadOnly means a write was attempted on a region opened by a reader; send writes to
	// the owner.
	ErrReadOnly = errors.New("shmsteer: region is read-only in this process")
	// ErrBusy means Close found snapshots or reads of this process still open; the region
	// stays mapped. Close every snapshot first.
	ErrBusy = errors.New("shmsteer: region still in use")
	// ErrReaderBusy means a Reader was used while a Snapshot taken from it is open; close the
	// snapshot first, or use another Reader.
	ErrReaderBusy = errors.New("shmsteer: reader has an open snapshot")
	// ErrClosed means the region or snapshot was already closed.
	ErrClosed = errors.New("shmsteer: closed")
	// ErrNoReaderSlot means every reader slot is claimed; create the region with more
	// ReaderSlots or close idle readers.
	ErrNoReaderSlot = errors.New("shmsteer: no free reader slot")
	// ErrSnapshotTooOld means the version asked for has already been reclaimed; pin it sooner
	// or hold a snapshot of it in some process while others pin it.
	ErrSnapshotTooOld = errors.New("shmsteer: snapshot version already reclaimed")
	// ErrSnapshotFuture means the version asked for has not been published yet.
	ErrSnapshotFuture = errors.New("shmsteer: snapshot version not yet published")
	// ErrReclaimStalled means SnapshotAt found a reclamation pass in flight for longer than a
	// pass takes, most likely left by an owner that died during it: an older version cannot be
	// pinned safely; read at the current version, or re-attach to a restarted owner.
	ErrReclaimStalled = errors.New("shmsteer: reclamation pass stalled")
	// ErrValueTooLarge means a value exceeds MaxValueLen or the whole arena.
	ErrValueTooLarge = errors.New("shmsteer: value too large")
	// ErrLeaseUnavailable means a reader could not take the lock that ties its reader slots to
	// its life: it needs /proc mounted (to reopen the reader file privately) and OFD locks.
	ErrLeaseUnavailable = errors.New("shmsteer: cannot take a reader-slot lease")
	// ErrMarked means a key has no value but carries a mark (Tx.Mark) at the version read: the
	// key registry's revoked sentinel. It matches ErrNotFound too (there is no value); test
	// for ErrMarked first where the difference matters.
	ErrMarked error = &markedError{}
	// ErrColumnsFull means no column of the pool is free for Tx.AllocColumn (after a
	// reclamation pass), or the region has no pool; the message says how the columns are
	// taken and what to do: end requests (delete the values that hold columns), unpin the
	// reader that holds retired ones, or raise Config.Columns.
	ErrColumnsFull = errors.New("shmsteer: no free column")
	// ErrBadColumn means Tx.Cell or Tx.Attach named a column this transaction did not reserve
	// (or a cell out of range), or Attach named a value not written in this transaction;
	// nothing was changed.
	ErrBadColumn = errors.New("shmsteer: bad column")
	// ErrUnsupported means this operating system lacks memfd; shmsteer needs Linux.
	ErrUnsupported = errors.New("shmsteer: shared regions need Linux memfd")
)

// markedError is ErrMarked: a sentinel that also matches ErrNotFound.
type markedError struct{}

func (*markedError) Error() string { return "shmsteer: key is marked (it has no value)" }
func (*markedError) Unwrap() error { return ErrNotFound }
