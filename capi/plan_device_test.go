//go:build cgo && linux

package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// TestPlanDeviceStepsInC runs device-path steps (SHMSTEER_BATCH_END) through the C ABI's order,
// the plan first, against a stepper without a plan that Go runs: once Go answered a step that
// left nothing to write (no table row, clamp record, gate or capture), the same batch advanced
// by its first positions at the same version gets that answer from C; a first step, an owner
// write, a reset, a Go call, other ids in the rows, other rows and a new slot's rows and clamp
// records go to Go. Every answer equals the reference's (version, checksum, slots, index,
// sites, updates), C's is Go's last one to the buffer, and the counters agree once Go counted
// C's steps.
func TestPlanDeviceStepsInC(t *testing.T) {
	o, cfg := planOwner(t)
	L := int32(cfg.Layers)
	attached := []int32{2*L + 0, 1*L + 2, 4*L + 1, 0*L + 1} // (0,1): "clamped"'s clamp
	ref, fast, bRef, bFast := planSteppers(t, o, attached)
	steps := deviceSteps()
	var last probeDevice
	var versions []uint64
	var held []shm.Snapshot
	for si, stp := range steps {
		what := fmt.Sprintf("step %d", si)
		if stp.late {
			// The version before the write stays pinned, as a scheduler pins the versions it
			// hands out (step 22 names it).
			snap, err := o.Engine.Region().Snapshot()
			require.NoError(t, err)
			held = append(held, snap)
			_, err = o.Admit(steer.Admission{RequestID: fmt.Sprint("late-", si)})
			require.NoError(t, err)
		}
		if stp.stats {
			probeStats(fast)
		}
		var spans []steer.Span
		for i, id := range stp.ids {
			spans = append(spans, steer.Span{ID: id, Start: i, End: i + 1, Phase: steer.PhaseDecode, Pos: 30 + si})
		}
		cs := newCSpans(spans)
		rows := len(spans) + stp.pad
		var at uint64
		if stp.at > 0 {
			at = versions[stp.at-1]
		}
		want, rcRef, _ := probeResolveDevice(bRef, cs, rows, probeFlagEnd|stp.flags, at)
		got, rc, inC := probeResolveDevice(bFast, cs, rows, probeFlagEnd|stp.flags, at)
		cs.free()
		require.Zero(t, rcRef, what)
		require.Zero(t, rc, what)
		require.Equal(t, stp.inC, inC, "%s answered in C", what)
		require.Equal(t, want.Version, got.Version, what)
		require.Equal(t, want.Checksum, got.Checksum, what)
		require.Equal(t, want.Slots, got.Slots, what)
		require.Equal(t, want.Index, got.Index, what)
		require.Equal(t, want.Sites, got.Sites, what)
		require.Equal(t, want.Updates, got.Updates, what)
		require.Equal(t, want.Clamps, got.Clamps, what)
		if inC {
			require.Equal(t, last.IndexAt, got.IndexAt, "%s: Go's last answer, its buffers", what)
		}
		last = got
		versions = append(versions, got.Version)
	}
	for i := range held {
		held[i].Close()
	}
	reclaimedArmed(t, o, bRef, bFast, versions[len(versions)-1])
	require.Equal(t, probeStats(ref), probeStats(fast), "the stepper's counters")
	require.Equal(t, probeBatchStats(bRef), probeBatchStats(bFast), "the batch's counters")
	require.Zero(t, o.Engine.Region().Stats().ReadersPinned, "no pin left")
}

// deviceStep is a step of TestPlanDeviceStepsInC.
type deviceStep struct {
	ids         []string
	flags       uint32 // beside END
	late, stats bool   // an owner write before it; a Go call (stats) before it
	pad         int
	at          int // an explicit version: that of step at-1's answer (0: the current one)
	inC         bool
}

func deviceSteps() []deviceStep {
	ids := []string{"c-0", "entry", "c-2", "plain"}
	swapped := []string{"c-2", "entry", "c-0", "plain"}
	clamped := []string{"c-0", "clamped", "c-2", "plain"}
	return []deviceStep{
		{ids: ids},            // new slots: rows to write
		{ids: ids},            // steady: Go answers and arms C
		{ids: ids, inC: true}, // positions advanced
		{ids: ids, inC: true},
		{ids: ids, late: true},            // a new version: Go
		{ids: ids, inC: true},             // (the write changed nothing of the batch)
		{ids: ids, flags: probeFlagReset}, // a reset: Go, rows to write again
		{ids: ids},
		{ids: ids, inC: true},
		{ids: ids, stats: true}, // a Go call disarms
		{ids: ids, inC: true},   // re-armed by that step's Go answer
		{ids: swapped},          // other ids in the rows (their slots are written already): Go arms
		{ids: swapped, inC: true},
		{ids: swapped, inC: true},
		{ids: swapped, pad: 3}, // other rows
		{ids: swapped, pad: 3, inC: true},
		{ids: clamped},            // a new slot, its row and clamp records to write: Go
		{ids: clamped},            // written: Go arms
		{ids: clamped, inC: true}, // clamp records come with a slot's row only
		{ids: ids},
		{ids: ids, inC: true},
		{ids: ids, at: 21, inC: true}, // the armed version, explicit (a scheduler's)
		{ids: ids, at: 4},             // an older one (before step 4's write): Go, armed at it
		{ids: ids, at: 23, inC: true}, // that one again
		{ids: ids},                    // the current one: not the armed one, Go
		{ids: ids, inC: true},
	}
}

// reclaimedArmed reclaims the armed version and resolves at it: Go's refusal (too old) from
// both batches, not C's answer.
func reclaimedArmed(t *testing.T, o *steer.Owner, bRef, bFast uint64, armed uint64) {

	for i := range 3 {
		_, err := o.Admit(steer.Admission{RequestID: fmt.Sprint("later-", i)})
		require.NoError(t, err)
	}
	require.NoError(t, o.Engine.Region().Reclaim())
	require.Greater(t, o.Engine.Region().Stats().Horizon, armed, "the armed version reclaimed")
	cs := newCSpans([]steer.Span{{ID: "c-0", Start: 0, End: 1, Phase: steer.PhaseDecode, Pos: 99}, {ID: "entry", Start: 1, End: 2, Phase: steer.PhaseDecode, Pos: 99}, {ID: "c-2", Start: 2, End: 3, Phase: steer.PhaseDecode, Pos: 99}, {ID: "plain", Start: 3, End: 4, Phase: steer.PhaseDecode, Pos: 99}})
	_, rcRef, _ := probeResolveDevice(bRef, cs, 4, probeFlagEnd, armed)
	_, rc, inC := probeResolveDevice(bFast, cs, 4, probeFlagEnd, armed)
	cs.free()
	require.NotZero(t, rcRef, "too old")
	require.Equal(t, rcRef, rc)
	require.False(t, inC)
}

// TestDeviceResolveInGoAllocatesNothing: a device-path worker's changed batches (requests
// leaving and joining, their rows moving) resolved through the C ABI's Go entry, on a stepper
// with its C plan (each resolve settles the plan first): once the batch's buffers have grown,
// no resolve allocates (an allocation a step, under a model's forward, is a cold heap line and
// a step closer to a GC cycle).
func TestDeviceResolveInGoAllocatesNothing(t *testing.T) {
	o, cfg := planOwner(t)
	L := int32(cfg.Layers)
	_, _, _, b := planSteppers(t, o, []int32{2*L + 0, 1*L + 2, 4*L + 1, 0*L + 1})
	var layouts []*cSpans
	for _, ids := range [][]string{{"c-0", "entry", "c-2", "clamped"}, {"c-0", "c-2", "clamped"}, {"clamped", "other", "c-0"},
		{"entry", "c-1", "other", "c-2", "c-0"}} {
		var spans []steer.Span
		for i, id := range ids {
			spans = append(spans, steer.Span{ID: id, Start: 2 * i, End: 2*i + 1, Phase: steer.PhaseDecode, Pos: 30})
		}
		cs := newCSpans(spans)
		t.Cleanup(cs.free)
		layouts = append(layouts, cs)
	}
	round := func() {
		for _, cs := range layouts {
			if rc := probeResolveGo(b, cs, 10, probeFlagEnd, 0); rc != 0 {
				t.Fatalf("resolve: rc %d", rc)
			}
		}
	}
	round()
	require.Zero(t, testing.AllocsPerRun(20, round))
}
