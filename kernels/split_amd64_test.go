//go:build amd64 && !purego

package kernels

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSplitsByCPUID checks which CPUs take the avx512split path first, from CPUID words: the
// vendor string's three words and leaf 1's EAX (signatures of real parts).
func TestSplitsByCPUID(t *testing.T) {
	const amdB, amdC, amdD = 0x68747541, 0x444d4163, 0x69746e65       // "AuthenticAMD"
	const intelB, intelC, intelD = 0x756e6547, 0x6c65746e, 0x49656e69 // "GenuineIntel"
	for _, tc := range []struct {
		name    string
		b, c, d uint32
		eax     uint32
		want    bool
	}{
		{"Zen 4 (EPYC Genoa, family 0x19 model 0x11)", amdB, amdC, amdD, 0x00a10f11, true},
		{"Zen 4 (Ryzen 7000, family 0x19 model 0x61)", amdB, amdC, amdD, 0x00a60f12, true},
		{"Zen 5 (EPYC Turin, family 0x1a model 0x02)", amdB, amdC, amdD, 0x00b00f21, false},
		{"Zen 2 (family 0x17)", amdB, amdC, amdD, 0x00830f10, false},
		{"Intel Sapphire Rapids (family 6)", intelB, intelC, intelD, 0x000806f8, false},
		{"an Intel signature of family 0x19's bits", intelB, intelC, intelD, 0x00a10f11, false},
	} {
		require.Equal(t, tc.want, splitsByCPUID(tc.b, tc.c, tc.d, tc.eax), tc.name)
	}
	// Both AVX-512 paths are offered wherever one is, so both are tested on any AVX-512 CPU.
	paths := Paths()
	require.Equal(t, slices.Contains(paths, PathAVX512), slices.Contains(paths, PathAVX512Split), paths)
}

// TestAVX512TuningByCPUID checks which CPUs' avx512 path takes which add body.
func TestAVX512TuningByCPUID(t *testing.T) {
	const amdB, amdC, amdD = 0x68747541, 0x444d4163, 0x69746e65       // "AuthenticAMD"
	const intelB, intelC, intelD = 0x756e6547, 0x6c65746e, 0x49656e69 // "GenuineIntel"
	for _, tc := range []struct {
		name                string
		b, c, d             uint32
		blocksFrom, ymmFrom int
		pairs               bool
	}{
		{"Intel", intelB, intelC, intelD, intelBlocksFrom, intelYmmFrom, true},
		{"AMD", amdB, amdC, amdD, math.MaxInt, math.MaxInt, false},
		{"a mixed vendor string", intelB, amdC, intelD, math.MaxInt, math.MaxInt, false},
	} {
		blocksFrom, ymmFrom, pairs := avx512TuningByCPUID(tc.b, tc.c, tc.d)
		require.Equal(t, tc.blocksFrom, blocksFrom, tc.name)
		require.Equal(t, tc.ymmFrom, ymmFrom, tc.name)
		require.Equal(t, tc.pairs, pairs, tc.name)
	}
	for _, p := range supported {
		if p.id == idAVX512 {
			blocksFrom, ymmFrom, pairs := avx512Tuning()
			require.Equal(t, blocksFrom, p.blocksFrom)
			require.Equal(t, ymmFrom, p.ymmFrom)
			require.Equal(t, pairs, p.pairs)
		}
	}
}
