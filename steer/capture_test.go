package steer

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// testValidator is a stand-in for package capture's validators (steer cannot import it): a
// spec {"sites": [..], "kind": k, "list": [..]} taken as written, "bad" refused.
func testValidator(cfg ModelConfig, spec []byte, promptLen int) (CaptureSelect, error) {
	var v struct {
		Sites []int32
		Kind  CapturePosKind
		List  []int
	}
	if err := json.Unmarshal(spec, &v); err != nil {
		return CaptureSelect{}, fmt.Errorf("%w: %v", errTestSpec, err)
	}
	if promptLen < 1 {
		return CaptureSelect{}, fmt.Errorf("%w: prompt length %d", errTestSpec, promptLen)
	}
	return CaptureSelect{Sites: v.Sites, Positions: CapturePositions{Kind: v.Kind, List: v.List, PromptLen: promptLen}}, nil
}

var errTestSpec = errors.New("test spec refused")

func TestAdmitCaptureStored(t *testing.T) {
	e := newOwner(t, smallCfg, Options{CaptureConsumers: map[string]CaptureValidator{"fs": testValidator, "probe": testValidator}})
	cap := map[string]json.RawMessage{
		"probe": json.RawMessage(`{"sites": [0, 4], "kind": 4, "list": [1, 3]}`),
		"fs":    json.RawMessage(`{"sites": [2], "kind": 3}`),
	}
	_, err := e.Admit(Admission{RequestID: "r1", Capture: cap, PromptLen: 9})
	require.NoError(t, err)
	s, err := e.Region().Snapshot()
	require.NoError(t, err)
	rc, err := e.Capture(&s, "r1")
	require.NoError(t, err)
	require.Equal(t, 9, rc.PromptLen)
	require.Len(t, rc.Consumers, 2)
	require.Equal(t, "fs", rc.Consumers[0].Name) // name order
	require.JSONEq(t, string(cap["fs"]), string(rc.Consumers[0].Spec))
	require.Equal(t, []int32{2}, rc.Consumers[0].Sites)
	require.Equal(t, CapturePositions{Kind: CaptureAll, PromptLen: 9}, rc.Consumers[0].Positions)
	require.Equal(t, "probe", rc.Consumers[1].Name)
	require.Equal(t, []int32{0, 4}, rc.Consumers[1].Sites)
	require.Equal(t, CapturePositions{Kind: CaptureList, List: []int{1, 3}, PromptLen: 9}, rc.Consumers[1].Positions)
	// A reader (a worker, a consumer) reads the same.
	r := newReader(t, e, Options{})
	rs, err := r.Region().Snapshot()
	require.NoError(t, err)
	rc2, err := r.Capture(&rs, "r1")
	require.NoError(t, err)
	require.Equal(t, rc, rc2)
	rs.Close()
	s.Close()

	// End removes it; a request without capture has none.
	_, err = e.End("r1")
	require.NoError(t, err)
	_, err = e.Admit(Admission{RequestID: "r2", PromptLen: 4})
	require.NoError(t, err)
	s, err = e.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	for _, id := range []string{"r1", "r2", "never"} {
		rc, err := e.Capture(&s, id)
		require.NoError(t, err)
		require.Empty(t, rc.Consumers, id)
	}
}

// Every refusal is typed and changes nothing: no request entry, no version.
func TestAdmitCaptureRefused(t *testing.T) {
	e := newOwner(t, smallCfg, Options{CaptureConsumers: map[string]CaptureValidator{"fs": testValidator}})
	none := newOwner(t, smallCfg, Options{})
	for _, c := range []struct {
		e    *Owner
		a    Admission
		want error
	}{
		{e, Admission{Capture: map[string]json.RawMessage{"other": json.RawMessage(`{"sites": [0]}`)}, PromptLen: 3}, ErrCaptureConsumer},
		{none, Admission{Capture: map[string]json.RawMessage{"fs": json.RawMessage(`{"sites": [0]}`)}, PromptLen: 3}, ErrCaptureConsumer},
		{e, Admission{Capture: map[string]json.RawMessage{"fs": json.RawMessage(`{"sites": "x"}`)}, PromptLen: 3}, errTestSpec},
		{e, Admission{Capture: map[string]json.RawMessage{"fs": json.RawMessage(`{"sites": [0]}`)}, PromptLen: 0}, errTestSpec},
		{e, Admission{Capture: map[string]json.RawMessage{"fs": json.RawMessage(`{"sites": [0]}`)}, PromptLen: MaxPromptLen + 1}, ErrCaptureConsumer},
		// Too large says so, from a declared consumer (issue 41 item 7).
		{e, Admission{Capture: map[string]json.RawMessage{"fs": json.RawMessage(`{"sites": [0], "pad": "` + strings.Repeat("x", MaxCaptureSpec) + `"}`)}, PromptLen: 3}, ErrCaptureSpecTooLarge},
		// What a validator resolved is checked too.
		{e, Admission{Capture: map[string]json.RawMessage{"fs": json.RawMessage(`{"sites": [99]}`)}, PromptLen: 3}, ErrLayerRange},
		{e, Admission{Capture: map[string]json.RawMessage{"fs": json.RawMessage(`{"sites": [3, 1]}`)}, PromptLen: 3}, ErrLayerRange},
		{e, Admission{Capture: map[string]json.RawMessage{"fs": json.RawMessage(`{"sites": []}`)}, PromptLen: 3}, ErrCaptureConsumer},
		{e, Admission{Capture: map[string]json.RawMessage{"fs": json.RawMessage(`{"sites": [1], "kind": 4, "list": [2, 2]}`)}, PromptLen: 3}, ErrCaptureConsumer},
	} {
		c.a.RequestID = "r"
		v0 := c.e.Region().Version()
		_, err := c.e.Admit(c.a)
		require.ErrorIs(t, err, c.want, "%+v", c.a)
		if c.want == ErrCaptureSpecTooLarge {
			require.NotErrorIs(t, err, ErrCaptureConsumer)
			require.NotContains(t, err.Error(), "not declared")
		}
		require.Equal(t, v0, c.e.Region().Version(), "a refused admission wrote nothing")
		st, err := c.e.Status()
		require.NoError(t, err)
		require.Zero(t, st.AdmittedRequests)
	}
}

func TestCaptureEntryRoundTrip(t *testing.T) {
	rc := RequestCapture{PromptLen: 70000, Consumers: []CaptureConsumer{
		{Name: "a", Spec: []byte(`{}`), CaptureSelect: CaptureSelect{Sites: []int32{0, 1, 14}, Positions: CapturePositions{Kind: CaptureLastPrompt, PromptLen: 70000}}},
		{Name: "b.c", Spec: []byte(`{"x": [1, 2, 3]}`), CaptureSelect: CaptureSelect{Sites: []int32{5}, Positions: CapturePositions{Kind: CaptureList, List: []int{0, 69999}, PromptLen: 70000}}},
	}}
	b := encodeCapture(&rc)
	require.Zero(t, len(b)%8)
	got, err := decodeCapture(b, 15)
	require.NoError(t, err)
	require.Equal(t, rc, got)
	// Fewer sites in the model: refused.
	_, err = decodeCapture(b, 14)
	require.ErrorIs(t, err, ErrBadEncoding)
	// Every truncation and every extension is refused.
	for n := range len(b) {
		_, err := decodeCapture(b[:n], 15)
		require.ErrorIs(t, err, ErrBadEncoding, "truncated to %d", n)
	}
	_, err = decodeCapture(append(slices.Clone(b), 0, 0, 0, 0, 0, 0, 0, 0), 15)
	require.ErrorIs(t, err, ErrBadEncoding)
}

func FuzzDecodeCaptureEntry(f *testing.F) {
	rc := RequestCapture{PromptLen: 12, Consumers: []CaptureConsumer{
		{Name: "fs", Spec: []byte(`{"a":1}`), CaptureSelect: CaptureSelect{Sites: []int32{0, 3}, Positions: CapturePositions{Kind: CaptureList, List: []int{2, 5}}}},
		{Name: "zz", Spec: []byte(`null`), CaptureSelect: CaptureSelect{Sites: []int32{1}, Positions: CapturePositions{Kind: CaptureAll}}},
	}}
	f.Add(encodeCapture(&rc))
	f.Add([]byte("SCAP\x01\x00\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rc, err := decodeCapture(b, 10)
		if err != nil {
			require.ErrorIs(t, err, ErrBadEncoding)
			return
		}
		// What decodes re-encodes to the same bytes and holds only valid selections.
		require.Equal(t, b, encodeCapture(&rc))
		for _, c := range rc.Consumers {
			require.NotEmpty(t, c.Sites)
			for _, s := range c.Sites {
				require.Less(t, s, int32(10))
			}
			require.LessOrEqual(t, c.Positions.Kind, CaptureList)
		}
	})
}

func TestSpanPosChecked(t *testing.T) {
	e := newOwner(t, smallCfg, Options{})
	st := e.NewStepper()
	require.NoError(t, st.Begin(0))
	defer st.End()
	h := make([]float32, 2*smallCfg.Hidden)
	for _, pos := range []int{-1, MaxPromptLen} {
		err := st.Apply(0, 0, h, []Span{{ID: "a", Start: 0, End: 2, Phase: PhasePrefill, Pos: pos}})
		require.ErrorIs(t, err, ErrBadBatch, "pos %d", pos)
	}
	require.NoError(t, st.Apply(0, 0, h, []Span{{ID: "a", Start: 0, End: 2, Phase: PhasePrefill, Pos: MaxPromptLen - 2}}))
}
