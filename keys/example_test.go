//go:build linux

package keys_test

import (
	"crypto/rand"
	"fmt"
	"log/slog"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
)

// The owner opens its side (keys.Open: a *keys.Owner) and watches every key write, whichever
// process makes it; a worker attaches (keys.Attach: a *keys.Worker) and writes through the
// owner. OnChange exists on the Owner only: a worker's observer does not compile.
func Example() {
	secret := ipc.NewSecret([]byte(rand.Text())) // usually SHMSTEER_SECRET: leave Secret nil
	ns := "keys-example-" + rand.Text()
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: ns,
		Region: shm.Config{IndexSlots: 64, ArenaBytes: 1 << 16}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer owner.Close()
	reg, err := keys.Open(owner, keys.Options{})
	if err != nil {
		panic(err)
	}
	reg.OnChange(func(c keys.Change) { fmt.Println("owner saw", c.RequestID, "revoked:", c.Revoked) })

	client, err := ipc.Attach(ipc.ClientOptions{Secret: &secret, Namespace: ns})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	worker, err := keys.Attach(client)
	if err != nil {
		panic(err)
	}
	if err := worker.Set("r1", []byte("k1")); err != nil {
		panic(err)
	}
	k, err := reg.Get("r1", nil)
	fmt.Println(string(k), err)
	if err := worker.Remove("r1"); err != nil {
		panic(err)
	}
	_, err = worker.Get("r1", nil)
	fmt.Println(err)
	// Output:
	// owner saw r1 revoked: false
	// k1 <nil>
	// owner saw r1 revoked: true
	// shmsteer: key revoked for request id
}
