// Command shmsteer runs the shmsteer demo and benchmarks:
//
//	shmsteer demo [flags]    owner + worker processes steering through one shared region
//	shmsteer bench [flags]   comparisons with the alternatives users would otherwise pick
package main

import (
	"fmt"
	"os"

	"github.com/shmsteer/shmsteer/bench"
	"github.com/shmsteer/shmsteer/steer/demo"
)

func main() {
	// Re-executed children take their role from the environment before any flag parsing.
	demo.RunWorkerIfRequested()
	bench.RunChildIfRequested(map[string]bench.ChildFunc{keysChildRole: keysChild})
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "demo":
		os.Exit(demo.Main(os.Args[2:], os.Stdout, os.Stderr))
	case "bench":
		os.Exit(bench.Main(os.Args[2:], benchSources(), os.Stdout, os.Stderr))
	case "help", "-h", "--help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "shmsteer: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: shmsteer demo [flags] | shmsteer bench [flags]   (-h after a command lists its flags)")
}

// benchSources fills the bench hooks that need the steering engine or attached processes.
func benchSources() bench.Sources {
	src := bench.EngineSources()
	src.StepMixed, src.StepKernel = stepMixed, stepKernel
	src.KeysGet, src.KeysSetClient, src.KeysSetOwner = keysChildSetup("get"), keysChildSetup("set"), keysSetOwner
	src.KeysReaders = func(k int) ([]bench.Op, func() error, error) { return keysFromChildren("get", k) }
	return src
}
