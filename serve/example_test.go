package serve_test

import (
	"log"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/serve"
	"github.com/shmsteer/shmsteer/steer"
)

// A worker of `shmsteer serve --namespace prod`: it follows serve across restarts (reading the
// old region, flagged dead, until the restarted serve has restored its state), steers its
// hidden states with what the control API set, and reports its step checksums, which
// GET /v1/steering/dynamic compares across workers. Run with SHMSTEER_SECRET set as for serve.
func Example_worker() {
	f, err := ipc.Follow(ipc.FollowOptions{Client: ipc.ClientOptions{Namespace: "prod"}, Ready: serve.IsReady})
	if err != nil {
		log.Fatal(err) // ErrNotYetInitialized: start serve first
	}
	defer f.Close()
	var (
		client *ipc.Client
		eng    *steer.Worker
		st     *steer.Stepper
	)
	for step := uint64(1); step <= 3; step++ {
		if c := f.Client(); c != client { // first step, or serve restarted
			if st != nil {
				st.Close()
			}
			client = c
			if eng, err = steer.Attach(c.Region(), nil, steer.Options{Caller: c}); err != nil {
				log.Fatal(err)
			}
			st = eng.NewStepper()
		}
		if err := f.Err(); err != nil {
			log.Print(err) // serve is down: this step applies the last steering it published
		}
		cfg := eng.Config()
		hook, err := cfg.Hook("post_block")
		if err != nil {
			log.Fatal(err)
		}
		h := make([]float32, 2*cfg.Hidden) // two rows of request r1 at (post_block, layer 0)
		if err := st.Begin(0); err != nil {
			log.Fatal(err)
		}
		if err := st.Apply(hook, 0, h, []steer.Span{{ID: "r1", Start: 0, End: 2, Phase: steer.PhaseDecode}}); err != nil {
			log.Fatal(err)
		}
		sum := st.End()
		if err := serve.ReportChecksum(client, "rank0", step, sum); err != nil {
			log.Print(err)
		}
	}
	st.Close()
}
