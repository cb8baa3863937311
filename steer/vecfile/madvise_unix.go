//go:build unix

package vecfile

import "golang.org/x/sys/unix"

// dontNeed hands b's pages back to the kernel (madvise MADV_DONTNEED: mmap-go has no madvise);
// a read-only file mapping reads them from the file again if touched. Best effort.
func dontNeed(b []byte) { _ = unix.Madvise(b, unix.MADV_DONTNEED) }
