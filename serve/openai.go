package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/shmsteer/shmsteer/steer"
)

// OpenAIOptions are the model server's settings AdmissionFromRequest validates against.
type OpenAIOptions struct {
	// MaxClampDirections is the per-(hook, layer) clamp budget after the base and phase tiers
	// are concatenated (the fork's steering_config.max_clamp_directions; 0 disables clamps).
	// Negative means the fork's default, 4.
	MaxClampDirections int
}

// AdmissionFromRequest translates the per-request steering of an OpenAI request body (the
// fork's steering_vectors, prefill_steering_vectors, decode_steering_vectors — packed only —,
// steering_clamps and its phase tiers — entry lists or packed —, steering_name and
// conversation_id) into the body of POST /v1/requests/admit, for a model server that is not
// the fork. It validates as the fork's frontend does (pydantic types, SamplingParams and the
// input processor's width and clamp-budget checks), in the same order and with the same
// texts; the error wraps ErrBadInput (or a steer sentinel) and its text after the sentinel is
// the fork's 400 message. RequestID is left for the caller; steering_name becomes the
// admission's module; "steering" (declarative gates) is checked with steer.DecodeGates
// (steer.ErrBadGate, ErrGateUnsupported, ErrNonFinite) and passed on as the admission's
// Steering, whose names and sites the owner checks when it admits. A body with no steering field gives an AdmitRequest with no override.
func AdmissionFromRequest(body []byte, cfg steer.ModelConfig, opt OpenAIOptions) (AdmitRequest, error) {
	return admissionFromRequest(body, cfg, opt, true)
}

// admissionFromRequest is AdmissionFromRequest; fast says whether the body's fields are split
// by the fast reader first (FuzzAdmissionFromRequestFast compares the two).
func admissionFromRequest(body []byte, cfg steer.ModelConfig, opt OpenAIOptions, fast bool) (AdmitRequest, error) {
	var out AdmitRequest
	fields, err := openAIFields(body, fast)
	if err != nil {
		return out, err
	}
	str := func(k string) (string, error) {
		raw, ok := fields[k]
		if !ok || jsonKind(raw) == "NoneType" {
			return "", nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badInput("%s: Input should be a valid string, got %s", k, jsonKind(raw))
		}
		return s, nil
	}
	if out.Module, err = str("steering_name"); err != nil {
		return out, err
	}
	if out.Conversation, err = str("conversation_id"); err != nil {
		return out, err
	}
	if raw, ok := fields["steering"]; ok && jsonKind(raw) != "NoneType" {
		if _, err := steer.DecodeGates(raw, unpackHook); err != nil {
			return out, err
		}
		out.Steering = raw
	}
	req := setRequest{split: map[*byte]map[string]json.RawMessage{}}
	vecFields := []struct {
		name string
		dst  *tierVectors
	}{{"steering_vectors", &req.Vectors}, {"prefill_steering_vectors", &req.PrefillVectors}, {"decode_steering_vectors", &req.DecodeVectors}}
	for _, f := range vecFields {
		spec, err := packedOnly(fields[f.name], f.name, req.split)
		if err != nil {
			return out, err
		}
		*f.dst = spec
	}
	clampFields := []struct {
		name string
		dst  *tierClamps
	}{{"steering_clamps", &req.Clamps}, {"prefill_steering_clamps", &req.PrefillClamps}, {"decode_steering_clamps", &req.DecodeClamps}}
	for _, f := range clampFields {
		raw, ok := fields[f.name]
		if !ok || jsonKind(raw) == "NoneType" {
			continue
		}
		if jsonKind(raw) != "dict" {
			return out, badInput("%s: Input should be a valid dictionary, got %s", f.name, jsonKind(raw))
		}
		spec, ok := rawObject(raw)
		if !ok {
			if err := json.Unmarshal(raw, &spec); err != nil {
				return out, badInput("%s: %s", f.name, describeJSONError(err))
			}
		}
		*f.dst = spec
	}
	st, err := openAISteering(&req, cfg, opt)
	req.split = nil // read: the admission carries the tiers only
	if err != nil {
		var pe *payloadError
		if errors.As(err, &pe) {
			return out, fmt.Errorf("%w: %s", pe.sentinel, pe.msg)
		}
		return out, err
	}
	if !st.Empty() {
		out.Override = &req
	}
	return out, nil
}

// openAIFields splits an OpenAI body into its fields, with the fast reader first if fast
// (each value a copy, as encoding/json's).
func openAIFields(body []byte, fast bool) (map[string]json.RawMessage, error) {
	if fields, ok := rawObject(body); fast && ok {
		for k, v := range fields {
			fields[k] = slices.Clone(v)
		}
		return fields, nil
	}
	var fields map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(&fields); err != nil || fields == nil {
		msg := "want a JSON object"
		if err != nil {
			msg = describeJSONError(err)
		}
		return nil, badInput("request body: %s", msg)
	}
	return fields, nil
}

// packedOnly reads a per-request vector tier: {hook: SteeringHookPacked} only (the fork's
// pydantic type refuses the list-of-floats and {vector, scale} forms here).
func packedOnly(raw json.RawMessage, field string, split map[*byte]map[string]json.RawMessage) (tierVectors, error) {
	if len(raw) == 0 || jsonKind(raw) == "NoneType" {
		return nil, nil
	}
	if jsonKind(raw) != "dict" {
		return nil, badInput("%s: Input should be a valid dictionary, got %s", field, jsonKind(raw))
	}
	r := newJSONReader(raw)
	spec, ok := r.hooks(split)
	if !ok || !r.end() {
		spec = nil
		if err := json.Unmarshal(raw, &spec); err != nil {
			return nil, badInput("%s: %s", field, describeJSONError(err))
		}
	}
	for _, hook := range sortedKeys(spec) {
		blob, ok := split[&spec[hook][0]]
		if !ok && (json.Unmarshal(spec[hook], &blob) != nil || blob == nil) {
			return nil, badInput("%s.%s: Input should be a valid dictionary (a SteeringHookPacked blob), got %s", field, hook, jsonKind(spec[hook]))
		}
		for _, k := range []string{"dtype", "shape", "layer_indices", "data"} {
			if _, ok := blob[k]; !ok {
				return nil, badInput("%s.%s.%s: Field required (per-request vectors are SteeringHookPacked blobs {dtype, shape, layer_indices, data, scales?}; pack the vectors)", field, hook, k)
			}
		}
	}
	return spec, nil
}

// openAIVectorFields and openAIClampFields name each tier's field in the request body.
var (
	openAIVectorFields = map[steer.Phase]string{steer.PhaseBase: "steering_vectors", steer.PhasePrefill: "prefill_steering_vectors", steer.PhaseDecode: "decode_steering_vectors"}
	openAIClampFields  = map[steer.Phase]string{steer.PhaseBase: "steering_clamps", steer.PhasePrefill: "prefill_steering_clamps", steer.PhaseDecode: "decode_steering_clamps"}
)

// openAISteering parses and checks the tiers as the fork's SamplingParams and input processor
// do, in their order.
func openAISteering(req *setRequest, cfg steer.ModelConfig, opt OpenAIOptions) (steer.Steering, error) {
	st, err := parseOpenAITiers(req, cfg)
	if err != nil {
		return st, err
	}
	if err := checkOverlapWidths(&st); err != nil {
		return st, err
	}
	if err := checkOpenAIWidths(&st, cfg); err != nil {
		return st, err
	}
	return st, checkOpenAIClamps(&st, cfg, opt)
}

// parseOpenAITiers is unpack_steering_vectors (to_sampling_params), then SamplingParams' hook
// checks, for the vectors and then the clamps of every tier.
func parseOpenAITiers(req *setRequest, cfg steer.ModelConfig) (steer.Steering, error) {
	valid := make([]string, cfg.NumHooks())
	for i := range valid {
		valid[i] = cfg.HookName(steer.HookID(i))
	}
	sort.Strings(valid)
	var st steer.Steering
	for _, t := range req.tiers() {
		field := openAIVectorFields[t.phase]
		for _, hook := range sortedKeys(t.vecs) {
			if !slices.Contains(valid, hook) {
				return st, fmt.Errorf("%w: %s key %s is not a valid hook point. Valid values: %s", steer.ErrUnknownHook, field, pyStr(hook), pyList(valid))
			}
		}
		vs, err := parseVectorSpec(t.vecs, field, req.split)
		if err != nil {
			return st, err
		}
		st.Tier(t.phase).Vectors = vs
	}
	for _, t := range req.tiers() {
		field := openAIClampFields[t.phase]
		cs, err := parseClampSpec(t.cl, field)
		if err != nil {
			return st, err
		}
		for _, c := range cs {
			if !slices.Contains(valid, c.Hook) {
				return st, fmt.Errorf("%w: %s key %s is not a valid hook point. Valid values: %s", steer.ErrUnknownHook, field, pyStr(c.Hook), pyList(valid))
			}
		}
		st.Tier(t.phase).Clamps = cs
	}
	return st, nil
}

// checkOverlapWidths is SamplingParams' rule: overlapping (hook, layer) entries of the tiers
// have one width.
func checkOverlapWidths(st *steer.Steering) error {
	width := func(vs []steer.Vector) map[site]int {
		m := map[site]int{}
		for _, v := range vs {
			m[site{v.Hook, v.Layer}] = len(v.Data)
		}
		return m
	}
	base, pre, dec := width(st.Base.Vectors), width(st.Prefill.Vectors), width(st.Decode.Vectors)
	for _, pair := range []struct {
		a, b   map[site]int
		an, bn string
		vs     []steer.Vector
	}{{base, pre, "steering_vectors", "prefill_steering_vectors", st.Base.Vectors},
		{base, dec, "steering_vectors", "decode_steering_vectors", st.Base.Vectors},
		{pre, dec, "prefill_steering_vectors", "decode_steering_vectors", st.Prefill.Vectors}} {
		for _, v := range pair.vs {
			k := site{v.Hook, v.Layer}
			if w, ok := pair.b[k]; ok && w != pair.a[k] {
				return badInput("%s[%s][%d] has dimension %d but %s[%s][%d] has dimension %d. Overlapping entries must have matching dimensions.",
					pair.an, pyStr(v.Hook), v.Layer, pair.a[k], pair.bn, pyStr(v.Hook), v.Layer, w)
			}
		}
	}
	return nil
}

// openAIPhases are the tiers in the order the input processor checks them.
var openAIPhases = []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode}

// checkOpenAIWidths is the input processor's first check: every vector is as wide as the model.
func checkOpenAIWidths(st *steer.Steering, cfg steer.ModelConfig) error {
	for _, ph := range openAIPhases {
		for _, v := range st.Tier(ph).Vectors {
			if len(v.Data) != cfg.Hidden {
				return fmt.Errorf("%w: %s[%s][%d]: vector width %d != expected steering row width %d (model hidden size)", steer.ErrHiddenSize, openAIVectorFields[ph], pyStr(v.Hook), v.Layer, len(v.Data), cfg.Hidden)
			}
		}
	}
	return nil
}

// checkOpenAIClamps is the input processor's clamp checks: clamping enabled, directions as
// wide as the model, then at most opt.MaxClampDirections (default 4) directions per
// (hook, layer) in the base tier plus each of prefill and decode.
func checkOpenAIClamps(st *steer.Steering, cfg steer.ModelConfig, opt OpenAIOptions) error {
	if len(st.Base.Clamps)+len(st.Prefill.Clamps)+len(st.Decode.Clamps) == 0 {
		return nil
	}
	k := opt.MaxClampDirections
	if k < 0 {
		k = 4
	}
	if k == 0 {
		return badInput("Per-request clamps were provided but clamping is disabled (steering_config.max_clamp_directions=0).")
	}
	for _, ph := range openAIPhases {
		for _, c := range st.Tier(ph).Clamps {
			if len(c.Dir) != cfg.Hidden {
				return fmt.Errorf("%w: %s[%s]: clamp direction width %d does not match the model hidden size (%d)", steer.ErrHiddenSize, openAIClampFields[ph], pyStr(c.Hook), len(c.Dir), cfg.Hidden)
			}
		}
	}
	for _, ph := range []steer.Phase{steer.PhasePrefill, steer.PhaseDecode} {
		count := map[site]int{}
		for _, c := range slices.Concat(st.Base.Clamps, st.Tier(ph).Clamps) {
			count[site{c.Hook, c.Layer}]++
		}
		var over []site
		for s, n := range count {
			if n > k {
				over = append(over, s)
			}
		}
		if len(over) > 0 {
			sort.Slice(over, func(i, j int) bool {
				return over[i].hook < over[j].hook || over[i].hook == over[j].hook && over[i].layer < over[j].layer
			})
			s := over[0]
			return fmt.Errorf("%w: Clamp spec [%s][%d] has %d directions, exceeding max_clamp_directions=%d", steer.ErrBadClamp, pyStr(s.hook), s.layer, count[s], k)
		}
	}
	return nil
}
