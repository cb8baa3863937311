// An owner (the scheduler) and a worker: run with SHMSTEER_SECRET set; the owner starts the
// worker by running this program again with ROLE=worker.
package main

import (
	"fmt"
	"log"
	"os"
	"os/exec"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

var (
	model     = steer.ModelConfig{Hidden: 4, Layers: 2} // hooks: steer.DefaultHooks
	namespace = os.Getenv("APP_NAMESPACE")              // owners of one secret and namespace: one
)

func main() {
	if os.Getenv("ROLE") == "worker" {
		worker()
		return
	}
	region, err := steer.RegionConfig(model, shm.Config{})
	check(err)
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Namespace: namespace, Region: region}) // secret: SHMSTEER_SECRET
	check(err)
	defer owner.Close()
	reg, err := keys.Open(owner, keys.Options{}) // per-request keys; workers' key writes
	check(err)
	sched, err := steer.Open(owner.Region(), &model, steer.Options{Clients: owner.Clients})
	check(err)
	sched.Serve(func(op uint16, h func([]byte) ([]byte, error)) { owner.Handle(op, h) }) // workers' writes
	_, err = sched.Register("polite", []steer.Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: []float32{1, 0, 0, 0}}})
	check(err)
	_, err = sched.Admit(steer.Admission{RequestID: "r1",
		Override: &steer.Steering{Decode: steer.Tier{Refs: []steer.Ref{{Name: "polite", Strength: 0.5}}}}})
	check(err)
	check(reg.Set("r1", []byte("key of r1")))

	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "ROLE=worker")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	check(cmd.Run())
}

func worker() {
	client, err := ipc.Attach(ipc.ClientOptions{Namespace: namespace})
	check(err)
	defer client.Close()
	reg, err := keys.Attach(client)
	check(err)
	key, err := reg.Get("r1", nil)
	check(err)
	eng, err := steer.Attach(client.Region(), &model, steer.Options{Caller: client})
	check(err)
	_, err = eng.Register("from-worker", []steer.Vector{{Hook: "mlp_out", Layer: 0, Scale: 2, Data: []float32{0, 1, 0, 0}}})
	check(err)

	hook, err := model.Hook("post_block")
	check(err)
	h := make([]float32, 2*model.Hidden) // two rows of r1's hidden states at (post_block, layer 1)
	st := eng.NewStepper()
	defer st.Close()
	check(st.Begin(0))
	check(st.Apply(hook, 1, h, []steer.Span{{ID: "r1", Start: 0, End: 2, Phase: steer.PhaseDecode}}))
	st.End()
	fmt.Printf("%s: %v\n", key, h)
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
