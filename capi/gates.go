package main

import (
	"encoding/json"
	"fmt"

	"github.com/shmsteer/shmsteer/steer"
)

// gateUnpack reads an inline gate source's vectors of one hook in the C ABI's vector form: a
// list of {"layer": n, "scale": s, "data": [floats]} ("hook", when given, must be the key).
// Python's Owner.admit turns the fork's packed blobs into that form.
func gateUnpack(hook string, raw json.RawMessage) ([]steer.Vector, error) {
	var vs []steer.Vector
	if err := decodeJSONString(string(raw), &vs); err != nil {
		return nil, fmt.Errorf("%w: inline vectors of hook %q: want a list of {layer, scale, data}", steer.ErrBadGate, hook)
	}
	for i := range vs {
		if vs[i].Hook != "" && vs[i].Hook != hook {
			return nil, fmt.Errorf("%w: an inline vector of hook %q names hook %q", steer.ErrBadGate, hook, vs[i].Hook)
		}
		vs[i].Hook = hook
	}
	return vs, nil
}
