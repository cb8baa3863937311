//go:build linux

package capture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// Under tensor parallelism one rank writes the capture (rank 0 by default): the residual after
// the all-reduce is the same on every rank. Here every rank process attaches to the owner's
// region, steps the same captured requests and is handed the same ring (the one ring a writer
// may append to: two writers would tear it), with hidden states that name their rank, so a
// record from any rank but 0 is seen.

const rankChildEnv = "SHMSTEER_CAPTURE_RANK_CHILD"

var rankCfg = steer.ModelConfig{Hidden: 16, Layers: 3}

var rankIDs = []string{"a", "b", "c"}

// rankValue is hidden-state element i of a row at position pos, site site, as rank sees it.
func rankValue(rank, site, pos, i int) float32 {
	return float32(rank*1_000_000 + site*10_000 + pos*16 + i)
}

// rankSteps runs the steps of one rank: prefill of 4 tokens, then 6 decode steps, at every
// site, capturing into sink.
func rankSteps(e *steer.Engine, rank int, sink steer.CaptureSink) (steer.StepStats, error) {
	st := e.NewStepper()
	defer st.Close()
	if err := st.SetCapture(steer.CaptureOptions{Sink: sink, Rank: rank}); err != nil {
		return steer.StepStats{}, err
	}
	const prompt = 4
	d := rankCfg.Hidden
	for step := range 7 {
		var spans []steer.Span
		rows := 0
		for _, id := range rankIDs {
			n, pos, ph := 1, prompt+step-1, steer.PhaseDecode
			if step == 0 {
				n, pos, ph = prompt, 0, steer.PhasePrefill
			}
			spans = append(spans, steer.Span{ID: id, Start: rows, End: rows + n, Phase: ph, Pos: pos})
			rows += n
		}
		if err := st.Begin(0); err != nil {
			return steer.StepStats{}, err
		}
		for h := range rankCfg.NumHooks() {
			for l := range rankCfg.Layers {
				site := h*rankCfg.Layers + l
				blk := make([]float32, rows*d)
				for _, sp := range spans {
					for r := sp.Start; r < sp.End; r++ {
						for i := range d {
							blk[r*d+i] = rankValue(rank, site, sp.Pos+r-sp.Start, i)
						}
					}
				}
				if err := st.Apply(steer.HookID(h), l, blk, spans); err != nil {
					return steer.StepStats{}, err
				}
			}
		}
		st.End()
	}
	return st.Stats(), nil
}

// rankChild is one rank process: region on fds 3 and 4, the ring on fd 5.
func rankChild() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "rank child:", err)
		os.Exit(2)
	}
	rank, err := strconv.Atoi(os.Getenv(rankChildEnv))
	if err != nil {
		fail(err)
	}
	reg, err := shm.Open(os.NewFile(3, "data"), os.NewFile(4, "readers"))
	if err != nil {
		fail(err)
	}
	e, err := steer.Attach(reg, &rankCfg, steer.Options{})
	if err != nil {
		fail(err)
	}
	ring, err := OpenRing(5)
	if err != nil {
		fail(err)
	}
	stats, err := rankSteps(e.Engine, rank, NewRingSink(ring.Writer(10*time.Second)))
	if err != nil {
		fail(err)
	}
	json.NewEncoder(os.Stdout).Encode(stats)
	os.Exit(0)
}

func TestCaptureRankZeroOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	e := newOwner(t, rankCfg, map[string]string{"fs": TypeFilesystem})
	for _, id := range rankIDs {
		if _, err := e.Admit(steer.Admission{RequestID: id, PromptLen: 4, Capture: map[string]json.RawMessage{
			"fs": json.RawMessage(fsSpec(id, `{"post_block": "all", "mlp_out": [1]}`, `"all"`))}}); err != nil {
			t.Fatal(err)
		}
	}
	ring := newRing(t, 4<<20, 1)
	rd, err := ring.Attach(Block)
	if err != nil {
		t.Fatal(err)
	}
	data, readers := e.Region().Files()
	const ranks = 3
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for rank := range ranks {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), rankChildEnv+"="+strconv.Itoa(rank))
		cmd.ExtraFiles = []*os.File{data, readers, ringFile(t, ring)}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, &out)
	}
	for rank, cmd := range cmds { // every rank steps at once
		if err := cmd.Wait(); err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
		var st steer.StepStats
		if err := json.Unmarshal(outs[rank].Bytes(), &st); err != nil {
			t.Fatalf("rank %d: %v: %s", rank, err, outs[rank])
		}
		if want := st.Steps; want != 7 || rank == 0 && st.CaptureRecords == 0 || rank > 0 && st.CaptureRecords != 0 {
			t.Fatalf("rank %d: %d steps, %d records", rank, st.Steps, st.CaptureRecords)
		}
	}
	// What reached the ring is rank 0's, every record bitwise, each (request, site) once per step.
	pb, _ := rankCfg.Hook("post_block")
	mo, _ := rankCfg.Hook("mlp_out")
	type key struct {
		id   string
		site int
	}
	seen := map[key][]int{}
	n := 0
	for {
		rec, ok, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		n++
		h, _ := rankCfg.Hook(rec.Hook)
		site := int(h)*rankCfg.Layers + rec.Layer
		if h != pb && !(h == mo && rec.Layer == 1) {
			t.Fatalf("record of an uncaptured site %s %d", rec.Hook, rec.Layer)
		}
		var want []float32
		for _, pos := range rec.Positions {
			for i := range rankCfg.Hidden {
				want = append(want, rankValue(0, site, pos, i))
			}
		}
		if !bytes.Equal(rec.Data, shm.Float32Bytes(want)) {
			got := math.Float32frombits(uint32(rec.Data[0]) | uint32(rec.Data[1])<<8 | uint32(rec.Data[2])<<16 | uint32(rec.Data[3])<<24)
			t.Fatalf("record %s %s/%d positions %v: not rank 0's rows (first element %v)", rec.RequestID, rec.Hook, rec.Layer, rec.Positions, got)
		}
		k := key{rec.RequestID, site}
		seen[k] = append(seen[k], rec.Positions...)
	}
	all := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	if len(seen) != len(rankIDs)*(rankCfg.Layers+1) {
		t.Fatalf("%d (request, site) pairs captured, want %d", len(seen), len(rankIDs)*(rankCfg.Layers+1))
	}
	for k, pos := range seen {
		if !slices.Equal(pos, all) {
			t.Fatalf("%v: positions %v, want %v (once each)", k, pos, all)
		}
	}
	t.Logf("%d records from %d rank processes, all rank 0's", n, ranks)
}
