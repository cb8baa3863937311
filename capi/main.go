// Command capi is the C ABI of shmsteer: built with `go build -buildmode=c-shared` it is
// libshmsteer.so, the one place where cgo meets the engine. Its contract is shmsteer.h (every
// function, ownership rule and error code); C, C++ and Python (python/shmsteer, through ctypes)
// read the region through it, so every language runs the one Go implementation of the protocol,
// except a reader's gets of live keys, which a C reader answers without entering Go: shm's Go
// reader itself, translated to C from the one source both are generated from (keys_fast.c;
// see internal/shmlayout).
//
// `go generate ./capi` builds the library and copies its header (shmsteer.h, with the two it
// includes: shmsteer_errors.h and shmsteer_capture.h) into python/shmsteer/, where the Python
// package loads it (cgo's own generated header, which declares the internal functions, is
// removed).
//
// # Layers
//
// The exported ABI is the thin C wrappers of capi.c (shmsteer_*): each checks, in C, that the
// process has not forked since the library was loaded (a pthread_atfork child handler sets a
// flag) before it calls into Go, because the Go runtime does not survive fork: a forked child
// gets SHMSTEER_E_FORKED, never a hang. The Go functions they call (shmsteerGo_*) are exported
// for the wrappers only. Objects cross the boundary as generation-checked handles (handles.go),
// so a stale or foreign handle is SHMSTEER_E_BAD_HANDLE, never a crash. Errors are the codes of
// shmsteer.h, one per Go sentinel of shm, ipc, steer and steer/vecfile.
//
// # Error codes
//
// errors.tab is the one source of the codes: `go generate ./capi` (errgen.go, with
// internal/errtable) renders it into the SHMSTEER_E_* codes of shmsteer_errors.h (which
// shmsteer.h includes), the Go table of sentinels (errors_gen.go), the names behind
// shmsteer_error_name (errnames_gen.c) and the Python exception classes
// (python/shmsteer/errors.py). To add a sentinel to shm, ipc, steer or
// steer/vecfile, add one row to its package's block of errors.tab (the next free code of the
// package's range, its SHMSTEER_E_ name, the Go name, the Python class and its bases, one line
// of meaning) and run `go generate ./capi`. TestErrorTableCoversSentinels fails while a
// sentinel has no row, TestErrorTablesGenerated while a generated file is stale, and
// TestErrorTableOrderAndHierarchy when a row is shadowed by an earlier one or the Python classes
// do not follow errors.Is. A new package of sentinels gets a package line (its range) first.
//
// This package must not reach into the engine's internals: it calls the exported API of shm, ipc,
// steer and steer/vecfile only. unsafe is allowed here (and in shm/unsafe.go) because the C ABI needs it: C
// strings and buffers are viewed in place, never copied on the hot paths.
package main

// The error tables first (errors.tab is their one source), then the library.
//go:generate go run errgen.go
// The linker runs in a temporary directory, hence the absolute path of the version script
// (exports.map: only the shmsteer_* functions of shmsteer.h are exported).
//go:generate sh -c "go build -buildmode=c-shared -ldflags=-extldflags=-Wl,--version-script=$DOLLAR(pwd)/exports.map -o ../python/shmsteer/libshmsteer.so ."
//go:generate rm -f ../python/shmsteer/libshmsteer.h
// The header and the two it includes (its generated error codes, its capture part).
//go:generate cp shmsteer.h shmsteer_errors.h shmsteer_capture.h ../python/shmsteer/
// The Python package's key get extension (python/shmsteer/_fastkeys.c), beside the library; a
// message and no extension without python3-dev (the package then uses ctypes).
//go:generate sh pyext.sh

func main() {}
