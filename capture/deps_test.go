package capture

import (
	"os/exec"
	"strings"
	"testing"
)

// capture must not import serve, mirror or bench (its package doc): a worker or a consumer
// process links it without them.
func TestDepsStayOut(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH:", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, banned := range []string{"/serve", "/mirror", "/bench", "/cmd/"} {
			if strings.HasPrefix(p, "github.com/shmsteer/shmsteer") && strings.Contains(p, banned) {
				t.Errorf("capture imports %s", p)
			}
		}
	}
}
