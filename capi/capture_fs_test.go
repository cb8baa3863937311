//go:build cgo

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// shmsteer_capture_serve and shmsteer_capture_fs_*, called from C: every bad declaration is
// refused with its typed error and leaves the owner serving no capture (an admission naming the
// consumer is still refused, the region version held), a good one serves; the in-process
// filesystem consumer refuses bad options and a taken name, writes a captured request's rows
// in the fork's layout (4 rows: a prefill of 3 and one decode step), publishes its paths, and
// stops once with its counters.
func TestCaptureServeAndFS(t *testing.T) {
	gcc := requireTool(t, "gcc")
	lib := buildLibrary(t)
	bin := filepath.Join(t.TempDir(), "capture_fs")
	out, err := exec.Command(gcc, "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-O2", "-I", ".",
		filepath.Join("testdata", "capture_fs.c"), "-L", lib, "-lshmsteer", "-Wl,-rpath,"+lib, "-o", bin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	ns := fmt.Sprintf("capi-capture-fs-%d-%d", os.Getpid(), time.Now().UnixNano())
	root := filepath.Join(t.TempDir(), "captures")
	out, err = exec.Command(bin, ns, root).CombinedOutput()
	got := string(out)
	t.Log(got)
	require.NoError(t, err)
	for _, want := range []string{
		"empty: capi.ErrInvalidArgument unchanged\n",
		"null: capi.ErrInvalidArgument unchanged\n",
		"no type: capture.ErrConsumerType unchanged\n",
		"unknown type: capture.ErrConsumerType unchanged\n",
		"bad name: capture.ErrBadConsumer unchanged\n",
		"twice: capture.ErrBadConsumer unchanged\n",
		"one bad of two: capture.ErrConsumerType unchanged\n",
		"global before serve: capture.ErrNoHub\n",
		"serve: ok\n",
		"serve again: capi.ErrInvalidArgument\n",
		"null opt: capi.ErrInvalidArgument\n",
		"no root: capi.ErrInvalidArgument\n",
		"bad layout: capture.ErrBadLayout\n",
		"undeclared: capture.ErrUnknownConsumer\n",
		"bad policy: capture.ErrBadPolicy\n",
		"negative bound: capture.ErrBadPolicy\n",
		"fs start: ok\n",
		"taken: capture.ErrConsumerTaken\n",
		"admit: ok\n",
		"capture start: ok\n",
		"steps: 2\n",
		`"status":"ok"`,
		"fs stop: ok requests=1 ok=1 failed=0 records=2 ",
		"fs stop again: capi.ErrBadHandle\n",
		"closed: ok\n",
	} {
		require.Contains(t, got, want)
	}
	for _, f := range []string{"1_post_block.bin", "1_post_block.json"} {
		_, err := os.Stat(filepath.Join(root, "t", "r1", f))
		require.NoError(t, err)
	}
	js, err := os.ReadFile(filepath.Join(root, "t", "r1", "1_post_block.json"))
	require.NoError(t, err)
	require.Contains(t, string(js), `"shape":[4,8]`)
}
