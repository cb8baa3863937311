package keys

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The registry is part of a minimal worker (steer's TestWorkerDepsLean builds one that reads
// keys): it pulls no third-party code beyond x/sys and mmap-go, and of the module only the
// transport, the region and the leaf tables (no steering, no service, no mirror).
func TestDepsLean(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH:", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	slices.Sort(deps)
	require.Equal(t, []string{
		"github.com/edsrzf/mmap-go",
		"github.com/shmsteer/shmsteer/internal/observe",
		"github.com/shmsteer/shmsteer/internal/proto",
		"github.com/shmsteer/shmsteer/ipc",
		"github.com/shmsteer/shmsteer/keys",
		"github.com/shmsteer/shmsteer/shm",
		"golang.org/x/sys/unix",
	}, deps, "a new dependency of the key registry is a decision: change this list deliberately")
}
