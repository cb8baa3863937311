package dense_test

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/dense"
)

// A step applied to a [batch, seq, hidden] gorgonia tensor in place: leading dimensions are
// flattened into rows, so sequence 0's two tokens are rows 0-1 and sequence 1's are rows 2-3.
func ExampleApply() {
	model := steer.ModelConfig{Hidden: 3, Layers: 1}
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
	_, err = e.Admit(steer.Admission{RequestID: "seq-1",
		Override: &steer.Steering{Base: steer.Tier{Vectors: []steer.Vector{{Hook: "mlp_out", Scale: 2, Data: []float32{0, 0, 1}}}}}})
	if err != nil {
		panic(err)
	}
	t := tensor.New(tensor.WithShape(2, 2, 3), tensor.WithBacking(make([]float32, 12)))
	mlpOut, _ := model.Hook("mlp_out")
	st := e.NewStepper()
	defer st.Close()
	if err := st.Begin(0); err != nil {
		panic(err)
	}
	err = dense.Apply(st, mlpOut, 0, t, []steer.Span{{ID: "seq-1", Start: 2, End: 4, Phase: steer.PhaseDecode}})
	st.End()
	fmt.Println(err, t.Data())
	// Output: <nil> [0 0 0 0 0 0 0 0 2 0 0 2]
}
