package shm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// membarrier(2) commands; x/sys/unix has the syscall number but not these.
const (
	membarrierQuery                   = 0
	membarrierGlobalExpedited         = 1 << 1
	membarrierRegisterGlobalExpedited = 1 << 2
)

// registerMembarrier registers this process to receive the owner's expedited global barriers.
// Readers that registered pin with a plain store: the owner's barrier, issued between raising
// the horizon and scanning the slots, orders that store for them (an asymmetric fence: the rare
// writer pays for the frequent readers).
func registerMembarrier() bool {
	q, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierQuery, 0, 0)
	if errno != 0 || q&membarrierGlobalExpedited == 0 {
		return false
	}
	_, _, errno = unix.Syscall(unix.SYS_MEMBARRIER, membarrierRegisterGlobalExpedited, 0, 0)
	return errno == 0
}

// globalBarrier runs a full memory barrier on every thread of every registered process.
func globalBarrier() error {
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierGlobalExpedited, 0, 0); errno != 0 {
		return fmt.Errorf("shmsteer: membarrier: %w", errno)
	}
	return nil
}
