package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// gateUnpack reads an inline gate source's vectors of one hook: the fork's packed blob
// (SteeringHookPacked, {dtype, shape, layer_indices, data, scales?}: vecfile.Packed), or the C
// ABI's vector form, a list of {"layer": n, "scale": s, "data": [floats]} ("hook", when given,
// must be the key).
func gateUnpack(hook string, raw json.RawMessage) ([]steer.Vector, error) {
	if t := bytes.TrimSpace(raw); len(t) > 0 && t[0] == '{' {
		vs, err := vecfile.UnpackHook(hook, t)
		if err != nil {
			return nil, fmt.Errorf("%w: inline vectors of hook %q: %w", steer.ErrBadGate, hook, err)
		}
		return vs, nil
	}
	var vs []steer.Vector
	if err := decodeJSONString(string(raw), &vs); err != nil {
		return nil, fmt.Errorf("%w: inline vectors of hook %q: want a packed blob or a list of {layer, scale, data}", steer.ErrBadGate, hook)
	}
	for i := range vs {
		if vs[i].Hook != "" && vs[i].Hook != hook {
			return nil, fmt.Errorf("%w: an inline vector of hook %q names hook %q", steer.ErrBadGate, hook, vs[i].Hook)
		}
		vs[i].Hook = hook
	}
	return vs, nil
}
