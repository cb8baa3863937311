//go:build cgo

package main

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// The options JSON of shmsteer_vector_import maps onto vecfile.ImportOptions; bad options are
// typed errors.
func TestParseImportOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		js   string
		want vecfile.ImportOptions
		err  error
	}{
		{"empty", "", vecfile.ImportOptions{}, nil},
		{"blank", "  ", vecfile.ImportOptions{}, nil},
		{"all", `{"scale": 0.5, "layers": "2-5", "hook": "mlp_out", "format": "gguf", "max_bytes": 4096}`,
			vecfile.ImportOptions{Scale: 0.5, Layers: &vecfile.LayerRange{First: 2, Last: 5}, Hook: "mlp_out", Format: vecfile.FormatGGUF, MaxBytes: 4096}, nil},
		{"one layer", `{"layers": "3"}`, vecfile.ImportOptions{Layers: &vecfile.LayerRange{First: 3, Last: 3}}, nil},
		{"reversed range", `{"layers": "5-2"}`, vecfile.ImportOptions{}, vecfile.ErrBadOptions},
		{"bad range", `{"layers": "a-b"}`, vecfile.ImportOptions{}, vecfile.ErrBadOptions},
		{"zero scale", `{"scale": 0}`, vecfile.ImportOptions{}, vecfile.ErrBadOptions},
		{"scale rounds to 0", `{"scale": 1e-50}`, vecfile.ImportOptions{}, vecfile.ErrBadOptions},
		{"scale beyond float32", `{"scale": 1e300}`, vecfile.ImportOptions{}, vecfile.ErrBadOptions},
		{"negative cap", `{"max_bytes": -1}`, vecfile.ImportOptions{}, vecfile.ErrBadOptions},
		{"unknown field", `{"scael": 2}`, vecfile.ImportOptions{}, ErrInvalidArgument},
		{"not JSON", `{`, vecfile.ImportOptions{}, ErrInvalidArgument},
		{"trailing data", `{} {}`, vecfile.ImportOptions{}, ErrInvalidArgument},
		{"model hint", `{"model_hint": "a\nb"}`, vecfile.ImportOptions{}, steer.ErrBadModelHint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := parseImportOptions(tc.js)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// The options JSON of shmsteer_vector_import: any bytes either parse into options vecfile
// accepts, or fail with ErrInvalidArgument or vecfile.ErrBadOptions; never a panic.
func FuzzImportOptions(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `{"scale": 0.5, "layers": "2-5", "hook": "mlp_out", "format": "gguf", "max_bytes": 4096}`,
		`{"layers": "3"}`, `{"layers": "5-2"}`, `{"scale": 1e300}`, `{"scale": 0}`, `{"max_bytes": -1}`,
		`{"layers": "-1"}`, `{"layers": " 1 - 2 "}`, `{"x": 1}`, `{} []`, `null`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, hint, err := parseImportOptions(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, vecfile.ErrBadOptions) && !errors.Is(err, steer.ErrBadModelHint) {
				t.Fatalf("options %q: error %v is neither ErrInvalidArgument, vecfile.ErrBadOptions nor steer.ErrBadModelHint", s, err)
			}
			return
		}
		if hint != nil && steer.CheckModelHint(*hint) != nil {
			t.Fatalf("options %q: model hint %q accepted", s, *hint)
		}
		if o.Scale-o.Scale != 0 || o.MaxBytes < 0 || (o.Layers != nil && (o.Layers.First < 0 || o.Layers.First > o.Layers.Last)) {
			t.Fatalf("options %q parsed into invalid %+v", s, o)
		}
	})
}
