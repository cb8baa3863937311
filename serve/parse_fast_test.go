package serve

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// packedBody is an admit body with an inline override of layers × hidden float32 rows, packed.
func packedBody(t testing.TB, layers, hidden int) []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	var raw []byte
	idx := make([]int, layers)
	for l := range layers {
		idx[l] = l
		for range hidden {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(float32(rng.NormFloat64())))
		}
	}
	b, err := json.Marshal(map[string]any{"request_id": "r", "conversation": "c", "override": map[string]any{
		"decode_vectors": map[string]any{"post_block": map[string]any{"dtype": "float32", "shape": []int{layers, hidden},
			"layer_indices": idx, "data": base64.StdEncoding.EncodeToString(raw)}},
		"vector_refs": map[string]float32{"n": 0.5}}, "steering": nil, "prompt_len": 3})
	require.NoError(t, err)
	return b
}

// sameAsStrict checks the fast reader's answer for body against decodeStrict's: where it takes
// a body, encoding/json takes it too, with the same result.
func sameAsStrict(t *testing.T, body []byte) bool {
	fast, ok := fastAdmitRequest(body)
	var slow AdmitRequest
	err := decodeStrict(body, &slow)
	if !ok {
		return false
	}
	if err != nil {
		t.Fatalf("fast reader took %q, decodeStrict refuses it: %v", body, err)
	}
	if fast.Override != nil {
		for _, fields := range fast.Override.split {
			require.NotNil(t, fields) // a split hook object; encoding/json gives none
		}
		fast.Override.split = nil
	}
	require.Equal(t, slow, fast, "%s", body)
	return true
}

func TestFastAdmitRequestMatchesStrict(t *testing.T) {
	require.True(t, sameAsStrict(t, packedBody(t, 4, 8)), "the packed body takes the fast path")
	req, ok := fastAdmitRequest(packedBody(t, 4, 8))
	require.True(t, ok)
	blob := req.Override.DecodeVectors["post_block"]
	require.Equal(t, []string{"data", "dtype", "layer_indices", "shape"}, sortedKeys(req.Override.split[&blob[0]]),
		"the blob is split on the way, not read again")
	for _, c := range []struct {
		body string
		fast bool
	}{
		{`{}`, true},
		{` {"request_id":"a","tenant":"t","module":"m","compose":"add","prompt_len":-1} `, true},
		{`{"override":null,"steering":null,"capture":{"x":[1,2.5e-3,true,false,null]}}`, true},
		{`{"override":{"vectors":{},"clamps":null,"replace":true,"decode_vector_refs":{"a":1}}}`, true},
		{`{"override":{"vectors":{"pre_attn":{"1":[1,2,3,4]},"pre_attn":[]}}}`, true},
		{`{"request_id":"caf\u00e9\n","steering":[{"when":{"kind":"always"}}]}`, true},
		{"{\"request_id\":\"\xff\xfe\"}", true},
		{`{"Request_ID":"a"}`, false},                  // encoding/json matches other cases too
		{`{"request_id":"a","request_id":"b"}`, false}, // duplicate: the slow path's last-wins
		{`{"req\u0075est_id":"a"}`, false},             // escaped key
		{`{"unknown":1}`, false},
		{`{"prompt_len":1.5}`, false},
		{`{"prompt_len":"1"}`, false},
		{`{"override":[]}`, false},
		{`{"override":{"vectors":{"pre_\u0061ttn":{}}}}`, false},
		{`{} {}`, false},
		{`{}]`, false},
		{`{"request_id":"a\x01"}`, false},
		{`{"request_id":"a\q"}`, false},
		{`{"capture":[01]}`, false},
		{`{"capture":[1.]}`, false},
		{`{"override":{"vectors":{"pre_attn":{"0":[1, -2.5e-3, 3.4028235e38, -0]}}}}`, true},
		{`{"capture":[-]}`, false},
		{`{"capture":tru}`, false},
		{`{"capture":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, true},
		{`{"capture":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, false}, // both limit nesting to 10000
		{`[]`, false},
		{``, false},
	} {
		require.Equal(t, c.fast, sameAsStrict(t, []byte(c.body)), "%s", c.body)
	}
}

// FuzzFastAdmitRequest holds the fast reader to encoding/json: whatever it takes, decodeStrict
// takes with the same AdmitRequest (anything else goes to decodeStrict, which words the error).
func FuzzFastAdmitRequest(f *testing.F) {
	f.Add(packedBody(f, 2, 4))
	for _, s := range []string{`{"override":{"vectors":{"pre_attn":{"1":[1,2,3,4]}}},"prompt_len":2}`,
		`{"request_id":"a\"b\\c\u0041","capture":{"x":{"y":[1e5,-0.5E-2]}}}`, `{"Override":null}`,
		`{"override":{"decode_vectors":{"h":{"data":"QUJD","dtype":"float32"}},"replace":false}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { sameAsStrict(t, b) })
}

// FuzzRawObject holds rawObject to json.Unmarshal into a map[string]json.RawMessage on any
// bytes.
func FuzzRawObject(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":"x\"}","a":[{"}":"\\"}]}`, `{}`, `{"a":"\u00e9"}`, ` {"k" : null } `, "{\"a\":\"\xff\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want map[string]json.RawMessage
		err := json.Unmarshal(b, &want)
		got, ok := rawObject(b)
		if !ok {
			return
		}
		if err != nil || want == nil {
			t.Fatalf("rawObject took %q, encoding/json refuses it: %v", b, err)
		}
		require.Equal(t, len(want), len(got))
		for k, v := range want {
			require.Equal(t, string(v), string(got[k]), "key %q", k)
		}
	})
}

// vectorsEqual compares decoded vectors bit for bit (NaN payloads included).
func vectorsEqual(t *testing.T, want, got []steer.Vector) {
	require.Equal(t, len(want), len(got))
	for i := range want {
		w, g := want[i], got[i]
		require.Equal(t, [3]any{w.Hook, w.Layer, math.Float32bits(w.Scale)}, [3]any{g.Hook, g.Layer, math.Float32bits(g.Scale)})
		require.Equal(t, len(w.Data), len(g.Data))
		for j := range w.Data {
			if math.Float32bits(w.Data[j]) != math.Float32bits(g.Data[j]) {
				t.Fatalf("vector %d float %d: %#x, vecfile %#x", i, j, math.Float32bits(g.Data[j]), math.Float32bits(w.Data[j]))
			}
		}
	}
}

// checkFastPacked compares fastPackedVectors with vecfile's decoder; it reports whether the
// fast decoder took p.
func checkFastPacked(t *testing.T, p *vecfile.Packed) bool {
	got, ok := fastPackedVectors(p, p.Data, "h")
	gotb, okb := fastPackedVectors(p, []byte(p.Data), "h")
	want, err := p.Vectors("h")
	require.Equal(t, ok, okb)
	if !ok {
		return false
	}
	vectorsEqual(t, got, gotb)
	if err != nil {
		t.Fatalf("fast decoder took %+v, vecfile refuses it: %v", p, err)
	}
	vectorsEqual(t, want, got)
	return true
}

func TestFastPackedVectorsMatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range []string{"float32", "bfloat16", "float64"} {
		size := map[string]int{"float32": 4, "bfloat16": 2, "float64": 8}[dt]
		for _, shape := range [][2]int{{1, 1}, {1, 2}, {2, 3}, {3, 5}, {32, 64}} {
			raw := make([]byte, shape[0]*shape[1]*size)
			for i := range raw {
				raw[i] = byte(rng.Uint32())
			}
			idx := make([]int, shape[0])
			for i := range idx {
				idx[i] = 2 * i
			}
			p := vecfile.Packed{Dtype: dt, Shape: shape[:], LayerIndices: idx, Data: base64.StdEncoding.EncodeToString(raw)}
			require.True(t, checkFastPacked(t, &p), "%s %v", dt, shape)
			p.Scales = make([]float64, shape[0])
			for i := range p.Scales {
				p.Scales[i] = rng.NormFloat64()
			}
			require.True(t, checkFastPacked(t, &p), "%s %v scales", dt, shape)
			enc := p.Data
			// what the fast decoder leaves to vecfile (whose errors stay the API's)
			for _, bad := range []string{enc[:len(enc)-4], enc + "AAAA", strings.TrimRight(enc, "="), "!" + enc[1:],
				enc[:len(enc)/2] + "\n" + enc[len(enc)/2+1:], enc[:len(enc)-1] + "\n"} {
				if bad == enc {
					continue // no padding to trim
				}
				p.Data = bad
				require.False(t, checkFastPacked(t, &p), "%q", bad)
			}
			p.Data = enc
		}
	}
	p := vecfile.Packed{Dtype: "float16", Shape: []int{1, 2}, LayerIndices: []int{0}, Data: "ADwAPA=="}
	require.False(t, checkFastPacked(t, &p), "float16 is vecfile's")
}

// FuzzFastPackedVectors holds fastPackedVectors to vecfile's decoder on any blob.
func FuzzFastPackedVectors(f *testing.F) {
	f.Add(uint8(0), 1, 2, "AACAPwAAAEA=", -1)
	f.Add(uint8(1), 2, 3, "AAAAAAAAAAAAAAAA", 0)
	f.Add(uint8(2), 1, 1, "AAAAAAAA8D8=", 3)
	f.Add(uint8(0), 1, 1, "AACAP w==", 0)
	f.Fuzz(func(t *testing.T, dt uint8, rows, hidden int, data string, layer int) {
		dtypes := []string{"float32", "bfloat16", "float64", "float16", "int8"}
		p := vecfile.Packed{Dtype: dtypes[int(dt)%len(dtypes)], Shape: []int{rows, hidden}, Data: data}
		if rows >= 0 && rows < 64 {
			p.LayerIndices = make([]int, rows)
			for i := range p.LayerIndices {
				p.LayerIndices[i] = layer + i
			}
			if layer%2 == 0 {
				p.Scales = make([]float64, rows)
			}
		}
		checkFastPacked(t, &p)
	})
}

// FuzzAdmissionFromRequestFast holds AdmissionFromRequest with the fast reader to the same
// translation with encoding/json splitting the body: the same AdmitRequest or the same error.
func FuzzAdmissionFromRequestFast(f *testing.F) {
	f.Add([]byte(`{"model":"m","steering_vectors":{"post_block":{"dtype":"float32","shape":[1,8],"layer_indices":[2],"data":"AACAPwAAgD8AAIA/AACAPwAAgD8AAIA/AACAPwAAgD8="}},"conversation_id":"c"}`))
	f.Add([]byte(`{"steering_clamps":{"post_block":{"dtype":"float16","shape":[1,8],"layer_indices":[0],"data":"ADwAPAA8ADwAPAA8ADwAPA==","bounds":[[null,1]],"strengths":[0.5]}}}`))
	f.Add([]byte(`{"steering_name":"m","steering":[{"when":{"kind":"always"}}],"decode_steering_vectors":null} x`))
	f.Fuzz(func(t *testing.T, b []byte) {
		opt := OpenAIOptions{MaxClampDirections: -1}
		fast, ferr := admissionFromRequest(b, forkCfg, opt, true)
		slow, serr := admissionFromRequest(b, forkCfg, opt, false)
		if (ferr == nil) != (serr == nil) || ferr != nil && ferr.Error() != serr.Error() {
			t.Fatalf("fast: %v, encoding/json: %v", ferr, serr)
		}
		require.Equal(t, slow, fast)
	})
}

// FuzzFastFloats holds fastFloats to json.Unmarshal into a []float32.
func FuzzFastFloats(f *testing.F) {
	for _, s := range []string{`[1, -2.5e-3 ,0,-0, 3.4028235e38]`, `[]`, ` [ ] `, `[1e39]`, `[1,null]`, `[01]`, `[1.5,]`, `[1] x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := fastFloats(b)
		if !ok {
			return
		}
		var want []float32
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("fastFloats took %q, encoding/json refuses it: %v", b, err)
		}
		require.Equal(t, len(want), len(got))
		for i := range want {
			require.Equal(t, math.Float32bits(want[i]), math.Float32bits(got[i]), "float %d of %q", i, b)
		}
	})
}

func TestFastFloatsTakesNumberLists(t *testing.T) {
	d, ok := fastFloats([]byte(` [1, -2.5e-3 , 3.4028235e38,-0] `))
	require.True(t, ok)
	require.Equal(t, []float32{1, -2.5e-3, math.MaxFloat32, float32(math.Copysign(0, -1))}, d)
	require.Equal(t, uint32(0x80000000), math.Float32bits(d[3]))
	for _, s := range []string{`[1e39]`, `[1,null]`, `[01]`, `[1.5,]`, `[1] x`, `["1"]`, `{}`} {
		_, ok := fastFloats([]byte(s))
		require.False(t, ok, s)
	}
}

// TestFastReaderKnowsEveryField keeps the fast reader in step with AdmitRequest and setRequest:
// a field it does not know would send every body that gives it down the encoding/json path.
func TestFastReaderKnowsEveryField(t *testing.T) {
	names := func(v any) []string {
		var out []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			if rt.Field(i).IsExported() {
				out = append(out, strings.Split(rt.Field(i).Tag.Get("json"), ",")[0])
			}
		}
		return out
	}
	for _, n := range names(AdmitRequest{}) {
		require.True(t, sameAsStrict(t, []byte(`{"`+n+`":null}`)), n)
	}
	for _, n := range names(setRequest{}) {
		require.True(t, sameAsStrict(t, []byte(`{"override":{"`+n+`":null}}`)), n)
	}
}
