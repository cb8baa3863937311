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

// shmsteer_request_admit_binary, called from C: the same override admitted as JSON float lists
// and as float32 buffers publishes the same request entry (equal digests), the vectors alone
// make an override, and every bad pointer, length, tier, hook, layer or value is refused with
// its typed error, the region unchanged; a hook id beyond 16 bits is no hook at register (it
// was cut to its low 16 bits there: 65538 registered post_block) and apply.
func TestAdmitBinary(t *testing.T) {
	got := runAdmitProgram(t, "admit_binary")
	for _, want := range []string{
		"json: ok source=1\n",
		"binary: ok source=1 latched=1\n",
		"digests equal\n",
		"bare: ok source=1\n",
		"null vectors: capi.ErrInvalidArgument unchanged\n",
		"null data: capi.ErrInvalidArgument unchanged\n",
		"tier 3: capi.ErrInvalidArgument unchanged\n",
		"hook 5: steer.ErrUnknownHook unchanged\n",
		"hook 65538: steer.ErrUnknownHook unchanged\n",
		"short: steer.ErrHiddenSize unchanged\n",
		"huge len: steer.ErrHiddenSize unchanged\n",
		"layer 2: steer.ErrLayerRange unchanged\n",
		"layer -1: steer.ErrLayerRange unchanged\n",
		"nan: steer.ErrNonFinite unchanged\n",
		"inf scale: steer.ErrNonFinite unchanged\n",
		"overflow: steer.ErrOverflow unchanged\n",
		"duplicate: steer.ErrDuplicate unchanged\n",
		"duplicate of json: steer.ErrDuplicate unchanged\n",
		"bad json: capi.ErrInvalidArgument unchanged\n",
		"register hook 65538: steer.ErrUnknownHook unchanged\n",
		"apply hook 65539: capi.ErrInvalidArgument rows untouched\n",
		"apply hook 3: ok rows steered\n",
		"closed: ok\n",
	} {
		require.Contains(t, got, want)
	}
}

// shmsteer_request_admit_buffers, called from C: clamps passed by address publish the same
// request entry as the same clamps in JSON (equal digests), in their order (the decode tier's
// two clamps swapped make another entry), beside vectors by address; every bad pointer, length,
// tier, hook, layer, value, bound or strength is refused with its typed error, the region
// unchanged.
func TestAdmitBuffersClamps(t *testing.T) {
	got := runAdmitProgram(t, "admit_clamps")
	for _, want := range []string{
		"json: ok source=1\n",
		"buffers: ok source=1 latched=1\n",
		"digests equal\n",
		"swapped: ok digests differ\n",
		"both: ok source=1\n",
		"null clamps: capi.ErrInvalidArgument unchanged\n",
		"null dir: capi.ErrInvalidArgument unchanged\n",
		"tier 3: capi.ErrInvalidArgument unchanged\n",
		"hook 5: steer.ErrUnknownHook unchanged\n",
		"hook 65538: steer.ErrUnknownHook unchanged\n",
		"short: steer.ErrHiddenSize unchanged\n",
		"huge len: steer.ErrHiddenSize unchanged\n",
		"layer 2: steer.ErrLayerRange unchanged\n",
		"nan dir: steer.ErrNonFinite unchanged\n",
		"inf min: steer.ErrNonFinite unchanged\n",
		"min > max: steer.ErrBadClamp unchanged\n",
		"zero dir: steer.ErrBadClamp unchanged\n",
		"strength 2: steer.ErrBadClamp unchanged\n",
		"strength -0.5: steer.ErrBadClamp unchanged\n",
		"closed: ok\n",
	} {
		require.Contains(t, got, want)
	}
}

// runAdmitProgram builds testdata/<name>.c against the library and runs it with a namespace of
// its own; it returns what the program printed.
func runAdmitProgram(t *testing.T, name string) string {
	t.Helper()
	gcc := requireTool(t, "gcc")
	lib := buildLibrary(t)
	bin := filepath.Join(t.TempDir(), name)
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-I", ".", filepath.Join("testdata", name+".c"),
		"-L", lib, "-lshmsteer", "-Wl,-rpath,"+lib, "-lm", "-o", bin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	ns := fmt.Sprintf("capi-%s-%d-%d", name, os.Getpid(), time.Now().UnixNano())
	out, err = exec.Command(bin, ns).CombinedOutput()
	t.Log(string(out))
	require.NoError(t, err)
	return string(out)
}
