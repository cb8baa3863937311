package main

/*
#include <stdint.h>
#include "shmsteer.h"
*/
import "C"

import "github.com/shmsteer/shmsteer/steer"

// Probe vectors (steer.KindProbe): named vectors of kind "probe", read by gates; the same
// calls as named vectors, in their own namespace.

//export shmsteerGo_probe_view
func shmsteerGo_probe_view(h C.uint64_t, name *C.char, nameLen C.size_t, info *C.shmsteer_vector_info, entries *C.shmsteer_vector_entry, capacity C.size_t) C.int {
	return vectorView(steer.VectorProbe, h, name, nameLen, info, entries, capacity)
}

//export shmsteerGo_probe_list_json
func shmsteerGo_probe_list_json(h C.uint64_t, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	return vectorListJSON(steer.VectorProbe, h, buf, capacity, n)
}

//export shmsteerGo_probe_register
func shmsteerGo_probe_register(h C.uint64_t, name *C.char, nameLen C.size_t, entries *C.shmsteer_vector_entry, count C.size_t, version *C.uint64_t) C.int {
	return vectorRegister(steer.VectorProbe, h, name, nameLen, entries, count, version)
}

//export shmsteerGo_probe_unregister
func shmsteerGo_probe_unregister(h C.uint64_t, name *C.char, nameLen C.size_t, version *C.uint64_t) C.int {
	return vectorUnregister(steer.VectorProbe, h, name, nameLen, version)
}
