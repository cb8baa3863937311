package kernels_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/kernels"
)

// The kernel path is chosen at init from kernels.EnvPath, before go test starts recording the
// environment variables a test binary reads (the record starts inside testing.M.Run), so that
// read alone leaves the variable out of the test cache's key, and SHMSTEER_KERNELS=generic go
// test ./kernels could report a result cached from another path. A TestMain reading it before
// m.Run does not help for the same reason (checked: a run with another value then reports
// "(cached)"). So every test and fuzz target of this package reads it inside the test, through
// envPath (forEachPath does), and TestEveryTestReadsEnvPath keeps it so.

// envPath reads kernels.EnvPath where go test's record of the environment sees it.
func envPath(tb testing.TB) string {
	tb.Helper()
	return os.Getenv(kernels.EnvPath)
}

// TestEveryTestReadsEnvPath: each Test and Fuzz function of package kernels_test calls envPath
// or forEachPath, so that go test's cache keys every result on SHMSTEER_KERNELS.
func TestEveryTestReadsEnvPath(t *testing.T) {
	envPath(t)
	fset := token.NewFileSet()
	files, err := os.ReadDir(".")
	require.NoError(t, err)
	n := 0
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f.Name(), nil, 0)
		require.NoError(t, err)
		if file.Name.Name != "kernels_test" {
			continue // package kernels' own tests run no path-dependent kernel
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !(strings.HasPrefix(fn.Name.Name, "Test") || strings.HasPrefix(fn.Name.Name, "Fuzz")) {
				continue
			}
			reads := false
			ast.Inspect(fn.Body, func(x ast.Node) bool {
				if c, ok := x.(*ast.CallExpr); ok {
					if id, ok := c.Fun.(*ast.Ident); ok && (id.Name == "envPath" || id.Name == "forEachPath") {
						reads = true
					}
				}
				return !reads
			})
			require.True(t, reads, "%s (%s) reads %s neither through envPath nor forEachPath", fn.Name.Name, f.Name(), kernels.EnvPath)
			n++
		}
	}
	require.Greater(t, n, 20, "the package's tests were found")
}
