//go:build !amd64 || purego

package kernels

// streamCopyLines has no non-temporal stores on this build: StreamCopy copies.
func streamCopyLines(dst, src []byte) bool { return false }

func storeFence() {}

func prefetch(p *byte) {}
