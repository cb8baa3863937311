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
// worker attaches, reads a request's key straight from shared memory, and sends a write to
// the owner over its connection.
func Example() {
	secret := ipc.NewSecret([]byte(rand.Text())) // nil Secret reads SHMSTEER_SECRET
	ns := "example-" + rand.Text()
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: ns,
		Region: shm.Config{IndexSlots: 1024, ArenaBytes: 1 << 20}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer owner.Close()
	if err := owner.Keys().Set("req-1", []byte("k1")); err != nil {
		panic(err)
	}

	worker, err := ipc.Attach(ipc.ClientOptions{Secret: &secret, Namespace: ns})
	if err != nil {
		panic(err)
	}
	defer worker.Close()
	key, err := worker.Keys().Get("req-1", nil) // lock-free read of the shared region
	fmt.Println(string(key), err)

	if err := worker.Keys().Set("req-2", []byte("k2")); err != nil { // an RPC to the owner
		panic(err)
	}
	if err := worker.Keys().Remove("req-1"); err != nil {
		panic(err)
	}
	_, err = owner.Keys().Get("req-1", nil)
	fmt.Println(errors.Is(err, ipc.ErrKeyRevoked))
	key, _ = owner.Keys().Get("req-2", nil)
	fmt.Println(string(key))
	// Output:
	// k1 <nil>
	// true
	// k2
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
