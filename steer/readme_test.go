package steer

import (
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docs/library.md's program is testdata/libuser/main.go verbatim, and it builds and runs: owner
// and worker processes, a key read, a worker's Register, a steered step.
func TestReadmeLibraryProgram(t *testing.T) {
	readme, err := os.ReadFile("../docs/library.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "## Use as a library")
	require.True(t, ok, "docs/library.md has a \"Use as a library\" section")
	_, code, ok := strings.Cut(section, "```go\n")
	require.True(t, ok, "with a Go program")
	code, _, ok = strings.Cut(code, "```")
	require.True(t, ok)
	prog, err := os.ReadFile("testdata/libuser/main.go")
	require.NoError(t, err)
	require.Equal(t, string(prog), code, "docs/library.md and testdata/libuser/main.go differ: keep them in sync")

	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH:", err)
	}
	bin := filepath.Join(t.TempDir(), "libuser")
	out, err := exec.Command(goTool, "build", "-o", bin, "./testdata/libuser").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "SHMSTEER_SECRET="+rand.Text(), "APP_NAMESPACE=readme-"+rand.Text())
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "key of r1: [0.5 0 0 0 0.5 0 0 0]")
}
