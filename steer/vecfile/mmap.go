package vecfile

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/edsrzf/mmap-go"
)

// releaseChunk batches the releases: one madvise per 32 MiB converted.
const releaseChunk = 32 << 20

// releaseMapped turns the page release off (the large-file test measures both ways).
var releaseMapped = true

// mapping is a read-only mapping of a whole file (mmap-go, as shm's regions).
type mapping struct {
	data     mmap.MMap
	released int // bytes [0, released) have been handed back to the kernel
}

func mapFile(f *os.File, size int64) (*mapping, error) {
	if size == 0 {
		return &mapping{}, nil
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%w: %d bytes do not fit the address space", ErrTooLarge, size)
	}
	b, err := mmap.MapRegion(f, int(size), mmap.RDONLY, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return &mapping{data: b}, nil
}

// release tells the kernel the pages below end are no longer needed, so a large import holds
// the mapped file and its converted result at once only one tensor at a time. Best effort.
func (m *mapping) release(end int) {
	if !releaseMapped {
		return
	}
	page := os.Getpagesize()
	end = end / page * page
	if end-m.released < releaseChunk || end > len(m.data) {
		return
	}
	dontNeed(m.data[m.released:end])
	m.released = end
}

func (m *mapping) close() {
	if m.data != nil {
		_ = m.data.Unmap()
		m.data = nil
	}
}

// guard runs parse with faults on the mapping turned into an error: if the file is truncated
// by another process while it is mapped, reading past its new end raises SIGBUS, which
// debug.SetPanicOnFault turns into a recoverable panic for this goroutine.
func (m *mapping) guard(path string, parse func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if re, ok := r.(runtime.Error); ok {
				if _, isFault := r.(interface{ Addr() uintptr }); isFault {
					err = fmt.Errorf("%w: %s changed while it was read (%v)", ErrCorrupt, path, re)
					return
				}
			}
			panic(r)
		}
	}()
	return parse()
}
