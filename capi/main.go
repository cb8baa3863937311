// Command capi is the C ABI of shmsteer: built with `go build -buildmode=c-shared` it is
// libshmsteer.so, the one place where cgo meets the engine. Its contract is shmsteer.h (every
// function, ownership rule and error code); C, C++ and Python (python/shmsteer, through ctypes)
// read the region through it, so every language runs the one Go implementation of the protocol.
//
// `go generate ./capi` builds the library and copies its header into python/shmsteer/, where
// the Python package loads it (cgo's own generated header, which declares the internal
// functions, is removed).
//
// # Layers
//
// The exported ABI is the thin C wrappers of capi.c (shmsteer_*): each checks, in C, that the
// process has not forked since the library was loaded (a pthread_atfork child handler sets a
// flag) before it calls into Go, because the Go runtime does not survive fork: a forked child
// gets SHMSTEER_E_FORKED, never a hang. The Go functions they call (shmsteerGo_*) are exported
// for the wrappers only. Objects cross the boundary as generation-checked handles (handles.go),
// so a stale or foreign handle is SHMSTEER_E_BAD_HANDLE, never a crash. Errors are the codes of
// shmsteer.h, one per Go sentinel of shm, ipc, steer and steer/vecfile (errors.go).
//
// This package must not reach into the engine's internals: it calls the exported API of shm, ipc,
// steer and steer/vecfile only. unsafe is allowed here (and in shm/unsafe.go) because the C ABI needs it: C
// strings and buffers are viewed in place, never copied on the hot paths.
package main

// The linker runs in a temporary directory, hence the absolute path of the version script
// (exports.map: only the shmsteer_* functions of shmsteer.h are exported).
//go:generate sh -c "go build -buildmode=c-shared -ldflags=-extldflags=-Wl,--version-script=$DOLLAR(pwd)/exports.map -o ../python/shmsteer/libshmsteer.so ."
//go:generate rm -f ../python/shmsteer/libshmsteer.h
//go:generate cp shmsteer.h ../python/shmsteer/shmsteer.h

func main() {}
