//go:build amd64 && !purego

package kernels

import "unsafe"

// streamCopy64 copies n bytes (a positive multiple of 64) from src to dst (64-byte aligned)
// with MOVNTDQ stores, unfenced (stream_amd64.s).
//
//go:noescape
func streamCopy64(dst, src unsafe.Pointer, n int)

// streamCopyLines copies src into dst (same length): the bytes up to dst's first 64-byte
// boundary and after its last one with copy, the whole lines between streamed.
func streamCopyLines(dst, src []byte) bool {
	n := len(src)
	head := int(-uintptr(unsafe.Pointer(&dst[0])) & 63)
	body := (n - head) &^ 63
	if body <= 0 {
		return false
	}
	copy(dst[:head], src[:head])
	streamCopy64(unsafe.Pointer(&dst[head]), unsafe.Pointer(&src[head]), body)
	copy(dst[head+body:], src[head+body:])
	return true
}

// storeFence is SFENCE (stream_amd64.s).
func storeFence()

// prefetch is PREFETCHT0 of p's line (stream_amd64.s).
//
//go:noescape
func prefetch(p *byte)
