package serve

import (
	"encoding/json"
	"slices"
)

// decodeAdmitRequest is decodeStrict(body, &req) for the body of POST /v1/requests/admit, with
// the fast reader (parse_fast.go) first: an inline override's packed blobs then cost one pass
// of the string loop instead of several of encoding/json's scanner. Anything the fast reader
// does not take is decoded by decodeStrict, which words the error.
func decodeAdmitRequest(body []byte) (AdmitRequest, error) {
	if req, ok := fastAdmitRequest(body); ok {
		return req, nil
	}
	var req AdmitRequest
	err := decodeStrict(body, &req)
	return req, err
}

// fastAdmitRequest decodes body as decodeStrict would, or reports !ok. Keys must be the
// fields' exact names (encoding/json also takes other cases), each given once.
func fastAdmitRequest(body []byte) (AdmitRequest, bool) {
	var req AdmitRequest
	fields, ok := splitObject(body, false)
	if !ok {
		return req, false
	}
	var seen fieldSet
	for _, f := range fields {
		var dst any
		i := 0
		switch f.key {
		case "request_id":
			dst = &req.RequestID
		case "tenant":
			i, dst = 1, &req.Tenant
		case "conversation":
			i, dst = 2, &req.Conversation
		case "module":
			i, dst = 3, &req.Module
		case "compose":
			i, dst = 4, &req.Compose
		case "prompt_len":
			i, dst = 5, &req.PromptLen
		case "steering":
			i, req.Steering = 6, slices.Clone(json.RawMessage(f.val))
		case "capture":
			i, req.Capture = 7, slices.Clone(json.RawMessage(f.val))
		case "override":
			i = 8
			if !isNull(f.val) {
				if req.Override, ok = fastSetRequest(f.val); !ok {
					return req, false
				}
			}
		default:
			return req, false
		}
		if !seen.add(i) {
			return req, false
		}
		if dst != nil && json.Unmarshal(f.val, dst) != nil {
			return req, false
		}
	}
	return req, true
}

// setRequestFields are setRequest's JSON names, in fastSetRequest's order.
var setRequestFields = []string{"vectors", "prefill_vectors", "decode_vectors", "clamps", "prefill_clamps",
	"decode_clamps", "vector_refs", "prefill_vector_refs", "decode_vector_refs", "replace"}

// fastSetRequest decodes an object into a setRequest as decodeStrict would, or reports !ok.
// b was validated by the caller's splitObject; the tiers' raw values alias it (the request
// lives no longer than its body).
func fastSetRequest(b []byte) (*setRequest, bool) {
	fields, ok := splitObject(b, true)
	if !ok {
		return nil, false
	}
	r := &setRequest{}
	tiers := []*map[string]json.RawMessage{(*map[string]json.RawMessage)(&r.Vectors),
		(*map[string]json.RawMessage)(&r.PrefillVectors), (*map[string]json.RawMessage)(&r.DecodeVectors),
		(*map[string]json.RawMessage)(&r.Clamps), (*map[string]json.RawMessage)(&r.PrefillClamps),
		(*map[string]json.RawMessage)(&r.DecodeClamps)}
	others := []any{&r.VectorRefs, &r.PrefillVectorRefs, &r.DecodeVectorRefs, &r.Replace}
	var seen fieldSet
	for _, f := range fields {
		i := slices.Index(setRequestFields, f.key)
		if i < 0 || !seen.add(i) {
			return nil, false
		}
		switch {
		case i >= len(tiers):
			if json.Unmarshal(f.val, others[i-len(tiers)]) != nil {
				return nil, false
			}
		case !isNull(f.val):
			if *tiers[i], ok = rawObject(f.val, true); !ok {
				return nil, false
			}
		}
	}
	return r, true
}
