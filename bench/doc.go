// Package bench owns `shmsteer bench`: it measures shmsteer side by side against what users
// would pick instead and reports the figures as an aligned table, a JSON array (--json) and a
// chart (--plot).
//
// It owns the measurement core (alternating A B A B rounds, rotated per round for the kernel
// sizes and step pairs, auto-calibrated batches, medians, ratios paired round by round within
// one alternation; the compute-only kernel and step ops timed by their thread's CPU time, see
// cpuOp),
// the child-process round driver (re-exec of the running binary, or a Python script, driven
// one round at a time over stdin/stdout), every baseline contender (a Go map, Python's
// multiprocessing SyncManager dict read from a spawned child, Redis over loopback, numpy and a
// plain Go loop for the steering add) and the shmsteer contenders, which it builds on the
// engine's public API: keys from attached child processes and the owner's Set (keysbench.go),
// the steering steps (stepbench.go, decodebench.go), the memory figures (memory.go,
// tp8bench.go) and the kernels and their C comparison (wired.go lists them all).
//
// It must not reach into the engine's internals or own any state format: it measures what
// shm, ipc, steer and kernels export. It never estimates a figure: a contender that cannot run
// is reported as skipped, with the reason, and is absent from the JSON.
//
// To start: cmd/shmsteer's `bench` command binds [BindFlags] and calls [Main]; a binary that
// runs the bench calls [RunChildIfRequested] first thing in main, since the bench re-executes
// it for its children. A new figure is a contender in runFigures' groups (bench.go) and, for the
// engine side, a field of sources filled by engineSources (wired.go).
package bench
