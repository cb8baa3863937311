//go:build ignore

// errgen renders the tables of error codes from errors.tab (see capi/internal/errtable):
// `go generate ./capi` runs it before building the library.
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/shmsteer/shmsteer/capi/internal/errtable"
)

func main() {
	out, err := errtable.Outputs(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "errgen:", err)
		os.Exit(1)
	}
	paths := make([]string, 0, len(out))
	for p := range out {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, out[p]) {
			continue
		}
		if err := os.WriteFile(filepath.Clean(p), out[p], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "errgen:", err)
			os.Exit(1)
		}
	}
}
