package shm

// Reader leases: how the owner tells a live reader from a dead one.
//
// A pid says nothing across PID namespaces: a worker in a container sees itself as pid 1 and
// reads its own /proc, so comparing pids and /proc start times clears live readers' slots (torn
// reads) or keeps dead ones forever (a stuck region). So a slot is tied to a kernel object that
// the kernel itself ends with the process, whatever its namespace: an open file description
// lock (F_OFD_SETLK) on the slot's 64 bytes of the reader file, taken through a description
// that this Region opened privately (/proc/self/fd/N: descriptors passed over SCM_RIGHTS or
// inherited share the owner's description, and OFD locks of one description never conflict).
// The kernel drops the lock when the last descriptor of that description closes: at process
// exit, after the process's memory is unmapped, so no thread of it can still be reading. The
// owner tests a slot with F_OFD_GETLK through its own description: no conflicting lock means
// the claimer is gone. A process that forked after opening shares its description with the
// child, so its slots live until both exit: the safe direction.

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// newLeaseWord returns a random slot owner word: top bit set, so it is never 0 (free) or
// clearingWord.
func newLeaseWord() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("shmsteer: reading a random lease: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]) | 1<<63, nil
}

// openPrivate opens a new open file description of f (a memfd) through /proc/self/fd, so that
// OFD locks taken through it are this Region's alone.
func openPrivate(f *os.File) (*os.File, error) {
	p, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: reopening the reader-slot file through /proc/self/fd (is /proc mounted in this process's mount namespace?): %w", ErrLeaseUnavailable, err)
	}
	var a, b unix.Stat_t
	if err := errors.Join(unix.Fstat(int(f.Fd()), &a), unix.Fstat(int(p.Fd()), &b)); err != nil || a.Dev != b.Dev || a.Ino != b.Ino {
		p.Close()
		return nil, fmt.Errorf("%w: /proc/self/fd gave another file (%v)", ErrLeaseUnavailable, err)
	}
	return p, nil
}

func slotLock(off uint64, typ int16) unix.Flock_t {
	return unix.Flock_t{Type: typ, Whence: 0, Start: int64(off), Len: lineSize}
}

// lockSlot takes this Region's lease on the slot at off; false if another description holds it.
func lockSlot(f *os.File, off uint64) (bool, error) {
	lk := slotLock(off, unix.F_WRLCK)
	switch err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EACCES):
		return false, nil
	default:
		return false, fmt.Errorf("%w: locking a reader slot: %w", ErrLeaseUnavailable, err)
	}
}

func unlockSlot(f *os.File, off uint64) {
	lk := slotLock(off, unix.F_UNLCK)
	unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}

// slotHeld reports whether some description other than f holds a lease on the slot at off.
// An error (which should not happen on a memfd) counts as held: never clear on doubt.
func slotHeld(f *os.File, off uint64) bool {
	lk := slotLock(off, unix.F_WRLCK)
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return true
	}
	return lk.Type != unix.F_UNLCK
}
