//go:build ignore

// layoutgen renders the layout table and the one reader (internal/shmlayout) into
// shm/layout_gen.go, shm/reader_gen.go and capi/shmread_gen.h: `go generate ./shm` runs it.
package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/shmsteer/shmsteer/internal/shmlayout"
)

func main() {
	out, err := shmlayout.Outputs("..")
	if err != nil {
		fmt.Fprintln(os.Stderr, "layoutgen:", err)
		os.Exit(1)
	}
	for p, b := range out {
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, b) {
			continue
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "layoutgen:", err)
			os.Exit(1)
		}
	}
}
