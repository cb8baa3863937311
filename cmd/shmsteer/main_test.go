package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestMain builds the shmsteer binary once into a temporary directory for the end-to-end tests.
func TestMain(m *testing.M) {
	runNATSIfRequested()
	dir, err := os.MkdirTemp("", "shmsteer-e2e-")
	if err != nil {
		panic(err)
	}
	binPath = filepath.Join(dir, "shmsteer")
	if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		panic("building shmsteer: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
