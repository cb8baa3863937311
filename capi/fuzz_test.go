//go:build cgo

package main

import (
	"errors"
	"testing"

	"github.com/shmsteer/shmsteer/steer"
)

// The steering JSON the ABI takes from callers: any bytes either decode into a Steering that
// the engine then validates with a typed error, or fail with ErrInvalidArgument; never a panic.
func FuzzSteeringJSON(f *testing.F) {
	for _, s := range []string{
		`{"base":{"vectors":[{"hook":"post_block","layer":1,"scale":1,"data":[1,2,3,4]}]}}`,
		`{"decode":{"refs":[{"name":"n","strength":2}]}}`,
		`{"base":{"clamps":[{"hook":"pre_attn","layer":0,"dir":[1,0,0,0],"min":0,"max":0,"strength":1}]}}`,
		`{"compose":1}`, `{}`, `[]`, `{"base":{"unknown":1}}`, `{"base":{}} {}`, ``, `{"base":{"vectors":[{"data":[1e39]}]}}`,
	} {
		f.Add(s)
	}
	cfg := steer.ModelConfig{Hidden: 4, Layers: 2}
	f.Fuzz(func(t *testing.T, s string) {
		var st steer.Steering
		if err := decodeJSONString(s, &st); err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("decode error %v is not ErrInvalidArgument", err)
			}
			return
		}
		if _, _, err := steer.EncodeSteering(&st, cfg); err != nil && codeOf(err) == codeOf(ErrOther) {
			t.Fatalf("steering error %v maps to no sentinel", err)
		}
	})
}

// The admission JSON decodes the same way.
func FuzzAdmissionJSON(f *testing.F) {
	f.Add(`{"tenant":"t","conversation":"c","override":{"base":{}}}`)
	f.Add(`{"override":null}`)
	f.Add(`{"capture":{"fs":{"request_id":"r","tag":"t","hooks":{"post_block":"all"},"positions":"all"}},"prompt_len":3}`)
	f.Fuzz(func(t *testing.T, s string) {
		var a admissionJSON
		if err := decodeJSONString(s, &a); err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("decode error %v is not ErrInvalidArgument", err)
		}
	})
}
