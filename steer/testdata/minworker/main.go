// Command minworker is the smallest shmsteer worker: it imports only ipc, keys and steer (no
// tensor adapter). TestWorkerDepsLean checks that it builds without gorgonia and its
// dependencies.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/steer"
)

func main() {
	client, err := ipc.Attach(ipc.ClientOptions{}) // secret from SHMSTEER_SECRET
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	reg, err := keys.Attach(client) // the request keys a step reads
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, err := reg.Get("r", nil); err != nil && !errors.Is(err, keys.ErrNotFound) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	eng, err := steer.Attach(client.Region(), nil, steer.Options{Caller: client})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	st := eng.NewStepper()
	defer st.Close()
	if err := st.Begin(0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	h := make([]float32, eng.Config().Hidden)
	err = st.Apply(0, 0, h, []steer.Span{{ID: "r", Start: 0, End: 1, Phase: steer.PhaseDecode}})
	fmt.Println(st.End(), err)
}
