package steer

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A worker that imports only ipc, keys and steer (testdata/minworker) must build without the tensor
// adapter's dependencies, and without the bench and plot ones.
func TestWorkerDepsLean(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH:", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./testdata/minworker").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var thirdParty []string
	for _, p := range strings.Fields(string(out)) {
		if !strings.HasPrefix(p, "github.com/shmsteer/shmsteer") {
			thirdParty = append(thirdParty, p)
		}
	}
	for _, p := range thirdParty {
		for _, heavy := range []string{"gorgonia.org/", "gonum.org/", "github.com/apache/arrow", "google.golang.org/protobuf", "github.com/gogo/protobuf", "github.com/redis/", "github.com/stretchr/"} {
			require.False(t, strings.HasPrefix(p, heavy), "a minimal worker compiles %s", p)
		}
	}
	// Today: golang.org/x/sys/{unix,cpu} and github.com/edsrzf/mmap-go. A new dependency of
	// the core is a decision: raise this bound deliberately.
	require.LessOrEqual(t, len(thirdParty), 4, "third-party packages of a minimal worker: %v", thirdParty)
	t.Logf("minimal worker: %d third-party packages: %v", len(thirdParty), thirdParty)
	// And it builds.
	out, err = exec.Command(goTool, "build", "-o", filepath.Join(t.TempDir(), "minworker"), "./testdata/minworker").CombinedOutput()
	require.NoError(t, err, "%s", out)
}
