package ipc_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
)

// An owner and a worker (here in one process; normally two, sharing SHMSTEER_SECRET): the
// worker attaches and reads what the owner wrote straight from shared memory (package keys and
// package steer build their state on this, and send their writes as RPCs: see Owner.Handle).
func Example() {
	secret := ipc.NewSecret([]byte(rand.Text())) // nil Secret reads SHMSTEER_SECRET
	ns := "example-" + rand.Text()
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: ns,
		Region: shm.Config{IndexSlots: 1024, ArenaBytes: 1 << 20}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer owner.Close()
	if _, err := owner.Region().Put(100, "greeting", []byte("hello")); err != nil {
		panic(err)
	}

	worker, err := ipc.Attach(ipc.ClientOptions{Secret: &secret, Namespace: ns})
	if err != nil {
		panic(err)
	}
	defer worker.Close()
	v, err := worker.Region().Get(100, "greeting", nil) // lock-free read of the shared region
	fmt.Println(string(v), err)
	_, err = worker.Region().Put(100, "greeting", []byte("bye"))
	fmt.Println(errors.Is(err, shm.ErrReadOnly)) // a worker writes through its owner
	fmt.Println(worker.Ping())
	// Output:
	// hello <nil>
	// true
	// <nil>
}

// Other packages add their own RPCs: the owner registers a handler for an op at or above
// MinUserOp, and a client calls it.
func ExampleOwner_Handle() {
	secret := ipc.NewSecret([]byte(rand.Text()))
	ns := "example-" + rand.Text()
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: ns,
		Region: shm.Config{IndexSlots: 64, ArenaBytes: 1 << 16}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer owner.Close()
	owner.Handle(ipc.MinUserOp, func(req []byte) ([]byte, error) {
		return append([]byte("hello, "), req...), nil
	})
	client, err := ipc.Attach(ipc.ClientOptions{Secret: &secret, Namespace: ns})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	resp, err := client.Call(ipc.MinUserOp, []byte("worker"))
	fmt.Println(string(resp), err)
	_, err = client.Call(ipc.MinUserOp+1, nil)
	fmt.Println(errors.Is(err, ipc.ErrUnknownOp))
	// Output:
	// hello, worker <nil>
	// true
}
