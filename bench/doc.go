// Package bench owns `shmsteer bench`: it measures shmsteer side by
// side against what users would pick instead and reports the figures as an
// aligned table, a JSON array (--json) and a chart (--plot).
//
// It owns the measurement core (alternating A B A B rounds, auto-calibrated
// batches, medians), the child-process round driver (re-exec of the running
// binary, or a Python script, driven one round at a time over stdin/stdout),
// and every baseline contender: a Go map, Python's multiprocessing SyncManager
// dict read from a spawned child, Redis over loopback, numpy and a plain Go
// loop for the steering add.
//
// It must not touch the shmsteer engine packages, and imports only the ones
// whose API is settled (kernels, kernels/ccompare, in wired.go, and shm for
// the memory overhead); the others (ipc, steer) are plugged in by
// cmd/shmsteer through [Sources] (its main's benchSources and the hooks it
// registers with [RegisterSources]), so this package builds and runs while
// they change. It never estimates a figure: a
// contender that cannot run is reported as skipped, with the reason, and is
// absent from the JSON.
package bench
