//go:build cgo

package main

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// packedF32 is the fork's SteeringHookPacked of one float32 row at layer 0.
func packedF32(row ...float32) string {
	b := make([]byte, 4*len(row))
	for i, f := range row {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return `{"dtype": "float32", "shape": [1, ` + strconv.Itoa(len(row)) + `], "layer_indices": [0], "data": "` +
		base64.StdEncoding.EncodeToString(b) + `"}`
}

const (
	gName   = `{"kind": "name", "name": "calm"}`
	gProbe  = `{"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.5, "sharpness": 4}`
	gAlways = `{"kind": "always"}`
	gAdd    = `{"kind": "add", "steer": ` + gName + `, "strength": 2}`
	gAtt    = `{"kind": "attenuate", "strength": 0.25}`
)

func gate(when, scope, apply string) string {
	return `{"when": ` + when + `, "scope": "` + scope + `", "apply": ` + apply + `}`
}

// shmsteer_gates_check through its C wrapper: every gate the docs list is accepted (each scope
// with add, attenuate where supported, named, packed and vector-form inline sources), with the
// count; what an admission refuses is refused with the admission's code and message.
func TestGatesCheck(t *testing.T) {
	inlinePacked := `{"kind": "inline", "packed": {"post_block": ` + packedF32(1, 0, 0, 0) + `}}`
	inlineList := `{"kind": "inline", "packed": {"mlp_out": [{"layer": 1, "scale": 1, "data": [0, 1, 0, 0]}]}}`
	var all []string
	for _, scope := range []string{"this_token", "next_step", "rest_of_request", "rest_of_conversation"} {
		all = append(all, gate(gProbe, scope, gAdd), gate(gAlways, scope, gAdd), gate(gAlways, scope, gAtt))
		if scope != "this_token" {
			all = append(all, gate(gProbe, scope, gAtt))
		}
	}
	all = append(all,
		gate(`{"kind": "probe", "probe": `+inlinePacked+`, "threshold": -1}`, "this_token", `{"kind": "add", "steer": `+inlineList+`}`),
		gate(gAlways, "next_step", `{"kind": "add", "steer": `+inlinePacked+`, "strength": 0.5}`))
	list := "[" + strings.Join(all, ", ") + "]"
	for _, tc := range []struct {
		name, js string
		n        int
	}{{"every kind", list, len(all)}, {"empty", "", 0}, {"null", "null", 0}, {"none", " [] ", 0}} {
		rc, n, msg := callGatesCheck(tc.js, true)
		require.Equal(t, 0, rc, "%s: %s", tc.name, msg)
		require.Equal(t, tc.n, n, tc.name)
		require.Empty(t, msg, tc.name)
	}
	rc, n, _ := callGatesCheck(list, false) // a NULL count is not written
	require.Equal(t, 0, rc)
	require.Equal(t, 12345, n)

	for _, tc := range []struct {
		name, js string
		err      error
		msg      string
	}{
		{"attenuate this_token probe", "[" + gate(gAlways, "next_step", gAdd) + ", " + gate(gProbe, "this_token", gAtt) + "]",
			steer.ErrGateUnsupported, "steering[1]: shmsteer: unsupported steering gate: attenuate with when=probe and scope=this_token is not supported"},
		{"malformed JSON", `[{"when": `, ErrInvalidArgument, "shmsteer: invalid argument: JSON: "},
		{"trailing data", `[] []`, ErrInvalidArgument, "trailing data"},
		{"not a list", `{"when": {}}`, steer.ErrBadGate, "'steering' must be a list of gate objects"},
		{"bad scope", "[" + gate(gAlways, "forever", gAdd) + "]", steer.ErrBadGate,
			`steering[0]: shmsteer: bad steering gate: scope: "forever" is not one of this_token, next_step, rest_of_request, rest_of_conversation`},
		{"no scope", `[{"when": ` + gAlways + `, "apply": ` + gAdd + `}]`, steer.ErrBadGate, "scope: missing required field"},
		{"unknown when", "[" + gate(`{"kind": "sometimes"}`, "next_step", gAdd) + "]", steer.ErrBadGate, `when.kind: "sometimes"`},
		{"negative sharpness", "[" + gate(`{"kind": "probe", "probe": `+gName+`, "threshold": 0, "sharpness": -1}`, "next_step", gAdd) + "]",
			steer.ErrBadGate, "probe sharpness must be non-negative"},
		{"threshold beyond float32", "[" + gate(`{"kind": "probe", "probe": `+gName+`, "threshold": 1e39}`, "next_step", gAdd) + "]",
			steer.ErrNonFinite, "when.threshold must be finite"},
		{"add without steer", "[" + gate(gAlways, "next_step", `{"kind": "add"}`) + "]", steer.ErrBadGate, "apply.steer: vector source must be an object"},
		{"packed blob of a bad dtype", "[" + gate(gAlways, "next_step", `{"kind": "add", "steer": {"kind": "inline", "packed": {"post_block": {"dtype": "int8", "shape": [1, 4], "layer_indices": [0], "data": "AAAAAA=="}}}}`) + "]",
			steer.ErrBadGate, `apply.steer.packed["post_block"]: shmsteer: bad steering gate: inline vectors of hook "post_block"`},
		{"name too long", "[" + gate(`{"kind": "probe", "probe": {"kind": "name", "name": "`+strings.Repeat("n", steer.MaxNameLen+1)+`"}, "threshold": 0}`, "next_step", gAdd) + "]",
			steer.ErrBadName, "when.probe: shmsteer: vector name empty or longer than 256 bytes (257 bytes)"},
		{"too many gates", "[" + strings.Join(slices.Repeat([]string{gate(gAlways, "next_step", gAdd)}, steer.MaxGates+1), ", ") + "]", steer.ErrBadGate, "65 gates, at most 64"},
	} {
		rc, n, msg := callGatesCheck(tc.js, true)
		require.Equal(t, errorNameOf(int(codeOf(tc.err))), errorNameOf(rc), "%s: %s", tc.name, msg)
		require.Contains(t, msg, tc.msg, tc.name)
		require.Equal(t, 12345, n, "%s: the count is written on success only", tc.name)
		_, err := checkGates(tc.js) // the message is the error's, whole
		require.Equal(t, err.Error(), msg, tc.name)
	}
	rc, _, msg := callGatesCheck("[]", true) // a success clears the thread's last error
	require.Equal(t, 0, rc)
	require.Empty(t, msg)
}
