//go:build !linux

package shm

// Off Linux no region can be made or opened: Create and Open fail with ErrUnsupported, since a
// region is two sealed memfds with OFD-locked reader leases and membarrier-ordered pins, all
// Linux's. These stubs stand in for region_linux.go, lease_linux.go and membarrier_linux.go so
// that the package (and steer, ipc above it) builds, vets and documents on other systems.

import (
	"fmt"
	"os"
	"runtime"
)

type mappings struct{ data, readers []byte }

func unsupported() error { return fmt.Errorf("%w (this is %s)", ErrUnsupported, runtime.GOOS) }

func (r *Region) createFiles() error                     { return unsupported() }
func (r *Region) openFiles(data, readers *os.File) error { return unsupported() }
func (r *Region) seal() error                            { return unsupported() }
func (r *Region) unmap() error                           { return nil }
func (r *Region) park() error                            { return nil }

func newLeaseWord() (uint64, error)                 { return 0, unsupported() }
func lockSlot(f *os.File, off uint64) (bool, error) { return false, unsupported() }
func unlockSlot(f *os.File, off uint64)             {}
func slotHeld(f *os.File, off uint64) bool          { return false }

func registerMembarrier() bool { return false }
func globalBarrier() error     { return unsupported() }

func allocDesc() *descPage { return nil }
func freeDesc(*descPage)   {}

func populate(pool []byte, lo, hi uint64) {}
