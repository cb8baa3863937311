package main

// A Python- or C-hosted owner's consumers' global specs (issue 24): shmsteer_capture_global,
// after shmsteer_capture_serve, as serve's --capture-global.

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"strings"
	"unsafe"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/steer"
)

//export shmsteerGo_capture_global
func shmsteerGo_capture_global(h C.uint64_t, name *C.char, nameLen C.size_t, spec *C.char, specLen C.size_t) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	o, ok := inst.side.(ownerSide)
	if !ok {
		return fail(steer.ErrNotOwner)
	}
	if inst.hub == nil {
		return fail(capture.ErrNoHub)
	}
	n, ok := cstr(name, nameLen)
	js, okb := cbytes(unsafe.Pointer(spec), specLen)
	if !ok || !okb || n == "" {
		return badArg("name and spec")
	}
	decl := map[string]string{}
	for _, c := range inst.hub.Status().Consumers {
		decl[c.Name] = c.Type
	}
	g, err := capture.GlobalSpecs(decl, map[string][]byte{strings.Clone(n): append([]byte(nil), js...)})
	if err != nil {
		return fail(err)
	}
	all := inst.global
	merged := make(map[string]steer.CaptureGlobalSpec, len(all)+1)
	for k, v := range all {
		merged[k] = v
	}
	for k, v := range g {
		merged[k] = v
	}
	if err := o.steer.SetCaptureGlobal(merged); err != nil {
		return fail(err)
	}
	inst.global = merged
	return C.SHMSTEER_OK
}
