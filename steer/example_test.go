//go:build linux

package steer_test

import (
	"crypto/rand"
	"fmt"
	"log/slog"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// The whole wiring, owner and worker in one process for the example (in production they are
// separate processes sharing SHMSTEER_SECRET): the owner creates the region with the model
// config, opens its side (steer.Open: a *steer.Owner) and serves steering writes; the worker
// attaches and opens its side (steer.Attach: a *steer.Worker), registers a named vector
// through the owner, the owner (the scheduler) admits a request that references it, and the
// worker applies a step to its hidden states. Admit exists on the Owner only: a worker's
// admission does not compile.
func Example() {
	secret := ipc.NewSecret([]byte(rand.Text())) // usually SHMSTEER_SECRET: leave Secret nil
	ns := "example-" + rand.Text()
	model := steer.ModelConfig{Hidden: 4, Layers: 2} // hooks: steer.DefaultHooks

	// Owner.
	region, err := steer.RegionConfig(model, shm.Config{})
	if err != nil {
		panic(err)
	}
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: ns, Region: region,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer owner.Close()
	sched, err := steer.Open(owner.Region(), &model, steer.Options{Clients: owner.Clients})
	if err != nil {
		panic(err)
	}
	sched.Serve(func(op uint16, h func([]byte) ([]byte, error)) { owner.Handle(op, h) })

	// Worker.
	client, err := ipc.Attach(ipc.ClientOptions{Secret: &secret, Namespace: ns})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	worker, err := steer.Attach(client.Region(), &model, steer.Options{Caller: client})
	if err != nil {
		panic(err)
	}
	_, err = worker.Register("polite", []steer.Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: []float32{1, 0, 0, 0}}})
	if err != nil {
		panic(err)
	}

	// The scheduler admits request r1 with half of "polite" while it decodes.
	_, err = sched.Admit(steer.Admission{RequestID: "r1",
		Override: &steer.Steering{Decode: steer.Tier{Refs: []steer.Ref{{Name: "polite", Strength: 0.5}}}}})
	if err != nil {
		panic(err)
	}

	// The worker's step: rows 0-1 are r1 decoding, row 2 belongs to an unsteered request.
	hook, _ := model.Hook("post_block")
	h := make([]float32, 3*model.Hidden)
	st := worker.NewStepper()
	defer st.Close()
	if err := st.Begin(0); err != nil {
		panic(err)
	}
	err = st.Apply(hook, 1, h, []steer.Span{{ID: "r1", Start: 0, End: 2, Phase: steer.PhaseDecode}})
	st.End()
	fmt.Println(err, h[0:4], h[4:8], h[8:12])
	// Output: <nil> [0.5 0 0 0] [0.5 0 0 0] [0 0 0 0]
}

// A step on the owner's own region, without any process around: the global steering adds to
// every row of every request, a request's own steering to its rows only.
func ExampleStepper_Apply() {
	model := steer.ModelConfig{Hidden: 3, Layers: 1, Hooks: []string{"resid"}}
	rc, err := steer.RegionConfig(model, shm.Config{IndexSlots: 64, ArenaBytes: 1 << 16})
	if err != nil {
		panic(err)
	}
	r, err := shm.Create(rc)
	if err != nil {
		panic(err)
	}
	defer r.Close()
	e, err := steer.Open(r, &model, steer.Options{})
	if err != nil {
		panic(err)
	}
	_, err = e.SetGlobal(steer.Steering{Base: steer.Tier{Vectors: []steer.Vector{{Hook: "resid", Scale: 1, Data: []float32{1, 1, 1}}}}})
	if err != nil {
		panic(err)
	}
	_, err = e.Admit(steer.Admission{RequestID: "a",
		Override: &steer.Steering{Prefill: steer.Tier{Vectors: []steer.Vector{{Hook: "resid", Scale: 10, Data: []float32{0, 1, 0}}}}}})
	if err != nil {
		panic(err)
	}
	_, err = e.Admit(steer.Admission{RequestID: "b"})
	if err != nil {
		panic(err)
	}
	st := e.NewStepper()
	defer st.Close()
	if err := st.Begin(0); err != nil {
		panic(err)
	}
	h := make([]float32, 3*3)
	err = st.Apply(0, 0, h, []steer.Span{
		{ID: "a", Start: 0, End: 1, Phase: steer.PhasePrefill},
		{ID: "b", Start: 1, End: 2, Phase: steer.PhaseDecode},
	})
	st.End()
	fmt.Println(err, h[0:3], h[3:6], h[6:9], st.Stats().UnknownRequests)
	// Output: <nil> [1 11 1] [1 1 1] [0 0 0] 0
}

// A conversation's steering latches: its later requests without an override inherit it (a
// bridge) until another override replaces it.
func ExampleOwner_Admit() {
	model := steer.ModelConfig{Hidden: 2, Layers: 1}
	rc, _ := steer.RegionConfig(model, shm.Config{IndexSlots: 64, ArenaBytes: 1 << 16})
	r, err := shm.Create(rc)
	if err != nil {
		panic(err)
	}
	defer r.Close()
	e, err := steer.Open(r, &model, steer.Options{})
	if err != nil {
		panic(err)
	}
	chat := steer.ConvKey{Tenant: "acme", ID: "chat-7"}
	calm := &steer.Steering{Base: steer.Tier{Vectors: []steer.Vector{{Hook: "mlp_out", Scale: -1, Data: []float32{1, 0}}}}}
	for _, a := range []steer.Admission{
		{RequestID: "turn-1", Conversation: chat, Override: calm},         // trigger: latched
		{RequestID: "turn-2", Conversation: chat},                         // bridge
		{RequestID: "other", Conversation: steer.ConvKey{Tenant: "acme"}}, // no conversation
	} {
		ad, err := e.Admit(a)
		if err != nil {
			panic(err)
		}
		fmt.Println(a.RequestID, ad.Source, ad.Latched)
	}
	// Output:
	// turn-1 override true
	// turn-2 latch false
	// other none false
}
