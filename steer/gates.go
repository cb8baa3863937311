package steer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
)

// Declarative gates, as the vLLM fork's per-request "steering" field has them
// (vllm/v1/steering_schema.py): a request may carry gates, each when × scope × apply.
//
//   - When: WhenAlways, or WhenProbe: the gate fires on sigmoid(Sharpness·(h·probe − Threshold))
//     > 0.5, h the residual at the probe's one (hook, layer) site.
//   - Scope: ScopeThisToken (rows at later sites of the same forward are gated per row),
//     ScopeNextStep (a one-step pulse on the step after it fired), ScopeRestOfRequest (sticky),
//     ScopeRestOfConversation (sticky, and carried onto the conversation's later requests).
//   - Apply: ApplyAdd (Strength × the steer vectors, on top of the request's decode steering) or
//     ApplyAttenuate (the request's steering damped by the factor Strength).
//
// A GateSource is a registered vector by name (a probe vector for When, a steering vector for
// Apply) or inline vectors. DecodeGates reads the fork's JSON; CheckGates is the fork's
// config-free validation (_validate_gate_semantics); the owner resolves names and checks the
// vectors against the model when it admits the request.

// ErrBadGate means a declarative gate is malformed: a missing or unknown kind or scope, a
// field of the wrong type, a negative sharpness, a source that is neither a name nor inline
// vectors, or an add that carries no vectors; the message names the gate and the field.
var ErrBadGate = errors.New("shmsteer: bad steering gate")

// ErrGateUnsupported means a gate asks for what the step cannot honour: attenuate with
// when=probe and scope=this_token (a row cannot be damped only when the probe fires in the same
// token); use scope next_step or rest_of_request.
var ErrGateUnsupported = errors.New("shmsteer: unsupported steering gate")

// WhenKind is a gate's trigger.
type WhenKind uint8

const (
	WhenAlways WhenKind = iota // "always"
	WhenProbe                  // "probe"
)

func (k WhenKind) String() string {
	switch k {
	case WhenAlways:
		return "always"
	case WhenProbe:
		return "probe"
	}
	return fmt.Sprintf("when(%d)", uint8(k))
}

// GateScope is how long a fired gate applies.
type GateScope uint8

const (
	ScopeThisToken          GateScope = iota // "this_token"
	ScopeNextStep                            // "next_step"
	ScopeRestOfRequest                       // "rest_of_request"
	ScopeRestOfConversation                  // "rest_of_conversation"
	numScopes
)

var scopeNames = [numScopes]string{"this_token", "next_step", "rest_of_request", "rest_of_conversation"}

func (s GateScope) String() string {
	if s < numScopes {
		return scopeNames[s]
	}
	return fmt.Sprintf("scope(%d)", uint8(s))
}

// ParseGateScope reads the fork's scope name; ok is false for anything else.
func ParseGateScope(s string) (GateScope, bool) {
	for i, n := range scopeNames {
		if n == s {
			return GateScope(i), true
		}
	}
	return 0, false
}

// ApplyKind is a gate's action.
type ApplyKind uint8

const (
	ApplyAdd       ApplyKind = iota // "add"
	ApplyAttenuate                  // "attenuate"
)

func (k ApplyKind) String() string {
	switch k {
	case ApplyAdd:
		return "add"
	case ApplyAttenuate:
		return "attenuate"
	}
	return fmt.Sprintf("apply(%d)", uint8(k))
}

// GateSource names a registered vector (Name; a probe vector for a probe, a steering vector for
// an add) or carries vectors inline (Vectors). Exactly one of them is set.
type GateSource struct {
	Name    string
	Vectors []Vector
}

// When is a gate's trigger. Threshold and Sharpness are used by WhenProbe only; the fork's
// default sharpness is 1.
type When struct {
	Kind      WhenKind
	Probe     GateSource
	Threshold float32
	Sharpness float32
}

// GateApply is a gate's action: ApplyAdd adds Strength × Steer (the fork's default strength is
// 1); ApplyAttenuate multiplies the request's steering by Strength (clamped at 0 from below).
type GateApply struct {
	Kind     ApplyKind
	Steer    GateSource
	Strength float32
}

// Gate is one declarative gate: when × scope × apply.
type Gate struct {
	When  When
	Scope GateScope
	Apply GateApply
}

// CheckGates validates gates without the model config (the fork's _validate_gate_semantics and
// the structural part of build_steering_gates): known kinds and scopes, a probe trigger's
// threshold and sharpness finite and sharpness ≥ 0, attenuate + probe + this_token refused
// (ErrGateUnsupported), every needed source set to exactly one of a name or inline vectors, an
// add's strength and an attenuation's factor finite. Sites, widths and names are checked when
// the owner admits the request.
func CheckGates(gates []Gate) error {
	for i := range gates {
		if err := gates[i].check(); err != nil {
			return fmt.Errorf("steering[%d]: %w", i, err)
		}
	}
	return nil
}

func (g *Gate) check() error {
	if g.Scope >= numScopes {
		return fmt.Errorf("%w: scope %d is not one of this_token, next_step, rest_of_request, rest_of_conversation", ErrBadGate, g.Scope)
	}
	switch g.When.Kind {
	case WhenAlways:
	case WhenProbe:
		if !finite(g.When.Threshold) {
			return fmt.Errorf("%w: when.threshold: probe threshold must be finite", ErrNonFinite)
		}
		if !finite(g.When.Sharpness) {
			return fmt.Errorf("%w: when.sharpness: probe sharpness must be finite", ErrNonFinite)
		}
		if g.When.Sharpness < 0 {
			return fmt.Errorf("%w: when.sharpness: probe sharpness must be non-negative, got %g", ErrBadGate, g.When.Sharpness)
		}
		if err := g.When.Probe.check("when.probe"); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: when.kind %d is not always or probe", ErrBadGate, g.When.Kind)
	}
	switch g.Apply.Kind {
	case ApplyAdd:
		if err := g.Apply.Steer.check("apply.steer"); err != nil {
			return err
		}
	case ApplyAttenuate:
		if g.When.Kind == WhenProbe && g.Scope == ScopeThisToken {
			return fmt.Errorf("%w: attenuate with when=probe and scope=this_token is not supported: a row cannot be damped only when the probe fires in the same token; use scope next_step or rest_of_request (host-evaluated) instead", ErrGateUnsupported)
		}
		if g.Apply.Steer.Name != "" || len(g.Apply.Steer.Vectors) > 0 {
			return fmt.Errorf("%w: apply: attenuate takes no steer vectors", ErrBadGate)
		}
	default:
		return fmt.Errorf("%w: apply.kind %d is not add or attenuate", ErrBadGate, g.Apply.Kind)
	}
	if !finite(g.Apply.Strength) {
		return fmt.Errorf("%w: apply.strength must be finite", ErrNonFinite)
	}
	return nil
}

func (s *GateSource) check(field string) error {
	switch {
	case s.Name != "" && len(s.Vectors) > 0:
		return fmt.Errorf("%w: %s: a vector source is a name or inline vectors, not both", ErrBadGate, field)
	case s.Name != "":
		if err := checkName(s.Name); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
	case len(s.Vectors) == 0:
		return fmt.Errorf("%w: %s: the vector source names no vector and carries none", ErrBadGate, field)
	}
	return nil
}

// Unpacker decodes the fork's packed blob of one hook (SteeringHookPacked: {dtype, shape,
// layer_indices, data, scales?}) into vectors of that hook. serve has one (serve.UnpackHook).
type Unpacker func(hook string, packed json.RawMessage) ([]Vector, error)

// MaxGates bounds the gates of one request, so a hostile body cannot make the step's work
// unbounded.
const MaxGates = 64

// DecodeGates reads the fork's "steering" value: a JSON list of gates
//
//	{"when": {"kind": "always"} | {"kind": "probe", "probe": SOURCE, "threshold": t, "sharpness": s?},
//	 "scope": "this_token" | "next_step" | "rest_of_request" | "rest_of_conversation",
//	 "apply": {"kind": "add", "steer": SOURCE, "strength": k?} | {"kind": "attenuate", "strength": f}}
//
// with SOURCE {"kind": "name", "name": N} or {"kind": "inline", "packed": {hook: packed}}, the
// packed blobs decoded by unpack (nil refuses inline sources). null or [] is no gates. Unknown
// keys are ignored, as the fork's schema does. The result passes CheckGates; every refusal
// wraps ErrBadGate, ErrGateUnsupported or ErrNonFinite (or unpack's error) and names the gate
// and field.
func DecodeGates(b []byte, unpack Unpacker) ([]Gate, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || string(b) == "null" {
		return nil, nil
	}
	var raws []json.RawMessage
	if b[0] != '[' || json.Unmarshal(b, &raws) != nil {
		return nil, fmt.Errorf("%w: 'steering' must be a list of gate objects", ErrBadGate)
	}
	if len(raws) > MaxGates {
		return nil, fmt.Errorf("%w: %d gates, at most %d", ErrBadGate, len(raws), MaxGates)
	}
	gates := make([]Gate, len(raws))
	for i, raw := range raws {
		if err := decodeGate(raw, unpack, &gates[i]); err != nil {
			return nil, fmt.Errorf("steering[%d]: %w", i, err)
		}
		if err := gates[i].check(); err != nil {
			return nil, fmt.Errorf("steering[%d]: %w", i, err)
		}
	}
	return gates, nil
}

// object reads a JSON object into its fields; ok is false for anything else (null included).
func object(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false
	}
	var m map[string]json.RawMessage
	return m, json.Unmarshal(raw, &m) == nil
}

// gateString reads a required JSON string field.
func gateString(m map[string]json.RawMessage, k, field string) (string, error) {
	raw, ok := m[k]
	if !ok {
		return "", fmt.Errorf("%w: %s: missing required field", ErrBadGate, field)
	}
	var s string
	if raw = bytes.TrimSpace(raw); len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", fmt.Errorf("%w: %s: expected a string", ErrBadGate, field)
	}
	return s, nil
}

// gateFloat reads a JSON number field (def when absent and required is false). A number beyond
// float32 is refused as non-finite.
func gateFloat(m map[string]json.RawMessage, k, field string, required bool, def float32) (float32, error) {
	raw, ok := m[k]
	if !ok {
		if required {
			return 0, fmt.Errorf("%w: %s: missing required field", ErrBadGate, field)
		}
		return def, nil
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
		return 0, fmt.Errorf("%w: %s: expected a number", ErrBadGate, field)
	}
	var num json.Number
	if json.Unmarshal(raw, &num) != nil {
		return 0, fmt.Errorf("%w: %s: expected a number", ErrBadGate, field)
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%w: %s: expected a number", ErrBadGate, field)
	}
	if f32 := float32(f); math.IsInf(float64(f32), 0) {
		return 0, fmt.Errorf("%w: %s must be finite, got %s (beyond float32)", ErrNonFinite, field, raw)
	}
	return float32(f), nil
}

func decodeGate(raw json.RawMessage, unpack Unpacker, g *Gate) error {
	m, ok := object(raw)
	if !ok {
		return fmt.Errorf("%w: each steering gate must be an object", ErrBadGate)
	}
	scope, err := gateString(m, "scope", "scope")
	if err != nil {
		return err
	}
	if g.Scope, ok = ParseGateScope(scope); !ok {
		return fmt.Errorf("%w: scope: %q is not one of this_token, next_step, rest_of_request, rest_of_conversation", ErrBadGate, scope)
	}
	when, ok := object(m["when"])
	if !ok {
		return fmt.Errorf("%w: when: expected an object {\"kind\": \"always\" | \"probe\", ...}", ErrBadGate)
	}
	kind, err := gateString(when, "kind", "when.kind")
	if err != nil {
		return err
	}
	switch kind {
	case "always":
		g.When.Kind = WhenAlways
	case "probe":
		g.When.Kind = WhenProbe
		if err := decodeSource(when["probe"], "when.probe", unpack, &g.When.Probe); err != nil {
			return err
		}
		if g.When.Threshold, err = gateFloat(when, "threshold", "when.threshold", true, 0); err != nil {
			return err
		}
		if g.When.Sharpness, err = gateFloat(when, "sharpness", "when.sharpness", false, 1); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: when.kind: %q is not always or probe", ErrBadGate, kind)
	}
	apply, ok := object(m["apply"])
	if !ok {
		return fmt.Errorf("%w: apply: expected an object {\"kind\": \"add\" | \"attenuate\", ...}", ErrBadGate)
	}
	if kind, err = gateString(apply, "kind", "apply.kind"); err != nil {
		return err
	}
	switch kind {
	case "add":
		g.Apply.Kind = ApplyAdd
		if err := decodeSource(apply["steer"], "apply.steer", unpack, &g.Apply.Steer); err != nil {
			return err
		}
		g.Apply.Strength, err = gateFloat(apply, "strength", "apply.strength", false, 1)
	case "attenuate":
		g.Apply.Kind = ApplyAttenuate
		g.Apply.Strength, err = gateFloat(apply, "strength", "apply.strength", true, 0)
	default:
		return fmt.Errorf("%w: apply.kind: %q is not add or attenuate", ErrBadGate, kind)
	}
	return err
}

func decodeSource(raw json.RawMessage, field string, unpack Unpacker, s *GateSource) error {
	m, ok := object(raw)
	if !ok {
		return fmt.Errorf("%w: %s: vector source must be an object {\"kind\": \"name\" | \"inline\", ...}", ErrBadGate, field)
	}
	kind, err := gateString(m, "kind", field+".kind")
	if err != nil {
		return err
	}
	switch kind {
	case "name":
		name, err := gateString(m, "name", field+".name")
		if err != nil || name == "" {
			return fmt.Errorf("%w: %s: named vector source requires a non-empty 'name'", ErrBadGate, field)
		}
		s.Name = name
		return nil
	case "inline":
		packed, ok := object(m["packed"])
		if !ok || len(packed) == 0 {
			return fmt.Errorf("%w: %s: inline vector source requires a non-empty 'packed'", ErrBadGate, field)
		}
		if unpack == nil {
			return fmt.Errorf("%w: %s: inline vectors are not decoded here", ErrBadGate, field)
		}
		for _, hook := range slices.Sorted(maps.Keys(packed)) {
			vs, err := unpack(hook, packed[hook])
			if err != nil {
				return fmt.Errorf("%s.packed[%q]: %w", field, hook, err)
			}
			s.Vectors = append(s.Vectors, vs...)
		}
		if len(s.Vectors) == 0 {
			return fmt.Errorf("%w: %s: inline vector source carries no vectors", ErrBadGate, field)
		}
		return nil
	}
	return fmt.Errorf("%w: %s.kind: vector source 'kind' must be 'name' or 'inline', got %q", ErrBadGate, field, kind)
}
