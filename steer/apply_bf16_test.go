package steer

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// torchBF16 narrows f as torch's float32 to bfloat16 conversion does: nearest even, NaN 0x7fc0.
func torchBF16(f float32) uint16 {
	if f != f {
		return 0x7fc0
	}
	b := math.Float32bits(f)
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// bf16Block rounds rng's floats to bfloat16 bytes and their widened float32 values.
func bf16Block(rng *rand.Rand, n int) ([]byte, []float32) {
	raw, wide := make([]byte, 2*n), make([]float32, n)
	for i, f := range randVec(rng, n) {
		b := torchBF16(f)
		binary.LittleEndian.PutUint16(raw[2*i:], b)
		wide[i] = math.Float32frombits(uint32(b) << 16)
	}
	return raw, wide
}

// TestApplyBF16MatchesApply steps batches through ApplyBF16 and, from the same values widened
// to float32, through Apply then torch's narrowing, at every site: the same bytes, checksum
// and counts (decode batches with runs and entries, clamps and a global vector, prefill and
// mixed multi-row spans, an unknown request, the empty batch). Rows outside every span keep
// their bytes, a NaN's payload included; a steered NaN stays a NaN.
func TestApplyBF16MatchesApply(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	d := cfg.Hidden
	decode := decodeRows
	batches := [][]Span{
		decode("c-0", "c-1", "c-2", "c-3", "one-site"),
		decode("c-0", "c-1", "entry-a", "c-2", "c-3", "plain", "one-site", "entry-b"),
		decode("one-site", "c-3", "c-2", "c-1", "c-0", "entry-b", "plain", "never-admitted"),
		{{ID: "c-1", Start: 0, End: 3, Phase: PhasePrefill}, {ID: "c-0", Start: 3, End: 4, Phase: PhaseDecode}, {ID: "entry-a", Start: 5, End: 7, Phase: PhasePrefill}},
		nil,
	}
	ap, bf := e.NewStepper(), e.NewStepper()
	defer ap.Close()
	defer bf.Close()
	rng := rand.New(rand.NewPCG(7, 8))
	for bi, batch := range batches {
		rows := 8
		require.NoError(t, ap.Begin(0))
		require.NoError(t, bf.Begin(0))
		spanned := make([]bool, rows)
		for _, sp := range batch {
			for r := sp.Start; r < sp.End; r++ {
				spanned[r] = true
			}
		}
		changed := false
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				what := fmt.Sprintf("batch %d site %d/%d", bi, hk, l)
				raw, wide := bf16Block(rng, rows*d)
				binary.LittleEndian.PutUint16(raw[2*(rows-1)*d:], 0x7f81) // a signalling NaN in the last row
				wide[(rows-1)*d] = math.Float32frombits(0x7f810000)
				got := slices.Clone(raw)
				require.NoError(t, ap.Apply(HookID(hk), l, wide, batch), what)
				require.NoError(t, bf.ApplyBF16(HookID(hk), l, got, slices.Clone(batch)), what)
				for i, f := range wide {
					r := i / d
					if !spanned[r] {
						require.Equal(t, raw[2*i:2*i+2], got[2*i:2*i+2], "%s: row %d is in no span", what, r)
						continue
					}
					g := binary.LittleEndian.Uint16(got[2*i:])
					if f != f { // torch makes every NaN 0x7fc0; ApplyBF16 keeps its payload
						require.True(t, g>>7&0xff == 0xff && g&0x7f != 0, "%s: element %d, a NaN, is %#x", what, i, g)
						continue
					}
					require.Equal(t, torchBF16(f), g, "%s: element %d", what, i)
				}
				changed = changed || !slices.Equal(raw, got)
			}
		}
		require.Equal(t, ap.End(), bf.End(), "checksum of batch %d", bi)
		sa, sb := ap.Stats(), bf.Stats()
		require.Equal(t, sa.Applies, sb.Applies)
		require.Equal(t, sa.ColumnRuns, sb.ColumnRuns, "batch %d", bi)
		require.Equal(t, sa.UnknownRequests, sb.UnknownRequests)
		require.Equal(t, len(batch) > 0, changed, "batch %d: steered iff it has spans", bi)
	}
}

// TestApplyBF16Refuses: what Apply refuses ApplyBF16 refuses, with h unchanged; an odd byte
// count or a partial row is ErrShape.
func TestApplyBF16Refuses(t *testing.T) {
	e, cfg := mixedDecodeEngine(t)
	d := cfg.Hidden
	st := e.NewStepper()
	defer st.Close()
	batch := []Span{{ID: "c-0", Start: 0, End: 1, Phase: PhaseDecode}, {ID: "c-1", Start: 1, End: 2, Phase: PhaseDecode}}
	h0, _ := bf16Block(rand.New(rand.NewPCG(3, 4)), 2*d)
	h := slices.Clone(h0)
	require.ErrorIs(t, st.ApplyBF16(0, 0, h, batch), ErrNoStep)
	require.NoError(t, st.Begin(0))
	require.ErrorIs(t, st.ApplyBF16(0, 0, h[:2*d+1], batch), ErrShape)
	require.ErrorIs(t, st.ApplyBF16(0, 0, h[:2*d+2], batch), ErrShape)
	require.ErrorIs(t, st.ApplyBF16(0, 0, h[:2*d], batch), ErrBadBatch, "a span past the block")
	require.ErrorIs(t, st.ApplyBF16(HookID(cfg.NumHooks()), 0, h, batch), ErrUnknownHook)
	require.ErrorIs(t, st.ApplyBF16(0, cfg.Layers, h, batch), ErrLayerRange)
	require.ErrorIs(t, st.ApplyBF16(0, 0, h, []Span{{ID: "c-0", Start: 0, End: 1, Phase: 9}}), ErrBadBatch)
	require.Equal(t, h0, h, "refused applies changed h")
	require.NoError(t, st.ApplyBF16(0, 0, h, batch))
	require.NotEqual(t, h0, h)
	st.End()
}
