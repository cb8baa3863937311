//go:build !cgo

package main

import "testing"

// Without cgo (no C compiler, or CGO_ENABLED=0) there is no C ABI to test.
func TestNeedsCgo(t *testing.T) {
	t.Skip("cgo disabled (no C compiler or CGO_ENABLED=0): libshmsteer.so, the C test and the Python suite need gcc")
}
