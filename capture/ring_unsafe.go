//go:build linux

package capture

import (
	"sync/atomic"
	"unsafe"
)

// word is the shared 64-bit word at off in the ring's mapping (off is a multiple of 8 below
// the header's size, checked by the callers' constants; the mapping is page aligned).
func word(mem []byte, off int) *atomic.Uint64 {
	_ = mem[off+7]
	return (*atomic.Uint64)(unsafe.Pointer(&mem[off]))
}
