// Command captureworker is a stand-in for a model worker with activation capture on, for the
// README's capture example: it attaches to the owner (the namespace's serve, SHMSTEER_SECRET
// or --secret-file), registers its capture ring with the owner's hub, and steps one request as
// a model would, a prefill of --prompt-len tokens then --decode decode steps, through a
// steer.Stepper whose hooks capture into the ring (SetCapture): at every layer's post_block
// the hidden state (synthetic: row r, element j is position + j/1000) is steered and the rows
// the request's capture spec selects are copied into the ring for the consumers.
//
//	go run ./internal/captureworker --namespace capdemo --request r1 --prompt-len 4 --decode 2
package main

import (
	"flag"
	"fmt"
	"log"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
	"golang.org/x/sys/unix"
)

func main() {
	ns := flag.String("namespace", "default", "namespace of the owner")
	secretFile := flag.String("secret-file", "", "file holding the shared secret (default: SHMSTEER_SECRET)")
	id := flag.String("request", "r1", "the admitted request to step")
	promptLen := flag.Int("prompt-len", 4, "prompt tokens (one prefill step)")
	decode := flag.Int("decode", 2, "decode steps after the prefill")
	tryResize := flag.Bool("try-resize", false, "after stepping, try to shrink and grow the registered ring as a hostile worker would, and print what each try got (the ring is sealed: both fail)")
	flag.Parse()
	if err := run(*ns, *secretFile, *id, *promptLen, *decode, *tryResize); err != nil {
		log.Fatal(err)
	}
}

func run(ns, secretFile, id string, promptLen, decode int, tryResize bool) error {
	cl, err := ipc.Attach(ipc.ClientOptions{Namespace: ns, SecretFile: secretFile})
	if err != nil {
		return err
	}
	defer cl.Close()
	eng, err := steer.Attach(cl.Region(), nil, steer.Options{Caller: cl})
	if err != nil {
		return err
	}
	w, err := capture.RegisterWorker(cl, capture.WorkerOptions{Capacity: 16 << 20})
	if err != nil {
		return err
	}
	defer w.Close()
	st := eng.NewStepper()
	defer st.Close()
	if err := st.SetCapture(steer.CaptureOptions{Sink: w.Sink()}); err != nil {
		return err
	}
	cfg := eng.Config()
	hook, err := cfg.Hook("post_block")
	if err != nil {
		return err
	}
	step := func(pos, rows int, phase steer.Phase) error {
		if err := st.Begin(0); err != nil {
			return err
		}
		span := []steer.Span{{ID: id, Start: 0, End: rows, Phase: phase, Pos: pos}}
		h := make([]float32, rows*cfg.Hidden)
		for layer := range cfg.Layers {
			for r := range rows {
				for j := range cfg.Hidden {
					h[r*cfg.Hidden+j] = float32(pos+r) + float32(j)/1000
				}
			}
			if err := st.Apply(hook, layer, h, span); err != nil {
				return err
			}
		}
		st.End()
		return nil
	}
	if err := step(0, promptLen, steer.PhasePrefill); err != nil {
		return err
	}
	for i := range decode {
		if err := step(promptLen+i, 1, steer.PhaseDecode); err != nil {
			return err
		}
	}
	s := st.Stats()
	fmt.Printf("captureworker: stepped %s (%d prefill rows, %d decode steps): %d records, %d bytes captured, %d refused\n",
		id, promptLen, decode, s.CaptureRecords, s.CaptureBytes, s.CaptureErrors)
	if tryResize {
		for _, size := range []int64{0, 1 << 30} {
			fmt.Printf("captureworker: resizing the ring to %d bytes: %v\n", size, unix.Ftruncate(w.Ring().Fd(), size))
		}
	}
	return nil
}
