package bench

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLeaveOneOutBest(t *testing.T) {
	// b is faster in most rounds; round 2's figure is a's because without round 2, a's median
	// (10) is below b's (10.5).
	cs := []figure{
		{Name: "kernels.add.16k.c_ns#a", Samples: []float64{10, 10, 10, 10}},
		{Name: "kernels.add.16k.c_ns#b", Samples: []float64{9, 12, 9, 12}},
		{Name: "kernels.add.16k.c_ns#c", Skipped: "no such shape"},
	}
	samples, picks, ok := leaveOneOutBest(cs)
	require.True(t, ok)
	require.Equal(t, []float64{10, 12, 10, 12}, samples)
	require.Equal(t, "a in 2, b in 2", picks)
	_, _, ok = leaveOneOutBest([]figure{{Name: "x#a", Samples: []float64{1, 2}}})
	require.False(t, ok, "too few rounds")
	_, _, ok = leaveOneOutBest([]figure{{Name: "x#a", Samples: []float64{1, 2, 3}}, {Name: "x#b", Samples: []float64{1, 2}}})
	require.False(t, ok, "unequal rounds")

	// Statistically equal variants: ours and four gcc variants drawn from one distribution
	// (a round's common load times each contender's own noise), 11 rounds, many trials. Picking
	// the variant of lowest median and pairing ours with its rounds (the old bestVariant) makes
	// ours look slower on average; leave-one-out does not.
	r := rand.New(rand.NewPCG(21, 21))
	const trials, rounds, variants = 3000, 11, 4
	var inSample, loo float64
	for range trials {
		draw := func(load []float64) []float64 {
			out := make([]float64, rounds)
			for i := range out {
				out[i] = load[i] * math.Exp(0.08*r.NormFloat64())
			}
			return out
		}
		load := make([]float64, rounds)
		for i := range load {
			load[i] = math.Exp(0.2 * r.NormFloat64())
		}
		ours := figure{Name: "kernels.add.16k.shmsteer_ns", Group: 1, Samples: draw(load)}
		var cs []figure
		best := 0
		for v := range variants {
			cs = append(cs, figure{Name: "kernels.add.16k.c_ns#" + string(rune('a'+v)), Group: 1, Samples: draw(load)})
			cs[v].Value = median(cs[v].Samples)
			if cs[v].Value < cs[best].Value {
				best = v
			}
		}
		old, _, ok := pairedRatio(ours, cs[best])
		require.True(t, ok)
		inSample += math.Log(old)
		c := bestVariant("kernels.add.16k.c_ns", cs, kernelSizes[0])
		c.Group = 1
		now, _, ok := pairedRatio(ours, c)
		require.True(t, ok)
		loo += math.Log(now)
	}
	inSample, loo = math.Exp(inSample/trials), math.Exp(loo/trials)
	t.Logf("geometric mean of ours/gcc among equals: in-sample pick %.4f, leave-one-out %.4f", inSample, loo)
	require.Greater(t, inSample, 1.01, "the old pick's winner's curse")
	require.InDelta(t, 1, loo, 0.004)
}
