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
// fields' exact names (encoding/json also takes other cases), each given once. One jsonReader
// walks the body down to the override's hooks, whose values alias body.
func fastAdmitRequest(body []byte) (AdmitRequest, bool) {
	var req AdmitRequest
	r := newJSONReader(body)
	var seen fieldSet
	ok := r.object(func(key string) bool {
		var dst any
		i := 0
		switch key {
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
			i, dst = 6, &req.Steering
		case "capture":
			i, dst = 7, &req.Capture
		case "override":
			if r.null() {
				return seen.add(8)
			}
			var ok bool
			req.Override, ok = fastSetRequest(r)
			return ok && seen.add(8)
		default:
			return false
		}
		v, ok := r.value()
		return ok && seen.add(i) && json.Unmarshal(v, dst) == nil
	})
	return req, ok && r.end()
}

// setRequestFields are setRequest's JSON names, in fastSetRequest's order.
var setRequestFields = []string{"vectors", "prefill_vectors", "decode_vectors", "clamps", "prefill_clamps",
	"decode_clamps", "vector_refs", "prefill_vector_refs", "decode_vector_refs", "replace"}

// fastSetRequest reads an object into a setRequest as decodeStrict would, or reports !ok. The
// tiers' raw values alias r's document (the request lives no longer than its body); a vector
// hook's object is split into its fields on the way (setRequest.split), so that a packed blob's
// data is scanned once.
func fastSetRequest(r *jsonReader) (*setRequest, bool) {
	s := &setRequest{split: map[*byte]map[string]json.RawMessage{}}
	tiers := []*map[string]json.RawMessage{(*map[string]json.RawMessage)(&s.Vectors),
		(*map[string]json.RawMessage)(&s.PrefillVectors), (*map[string]json.RawMessage)(&s.DecodeVectors),
		(*map[string]json.RawMessage)(&s.Clamps), (*map[string]json.RawMessage)(&s.PrefillClamps),
		(*map[string]json.RawMessage)(&s.DecodeClamps)}
	others := []any{&s.VectorRefs, &s.PrefillVectorRefs, &s.DecodeVectorRefs, &s.Replace}
	var seen fieldSet
	ok := r.object(func(key string) bool {
		i := slices.Index(setRequestFields, key)
		if i < 0 || !seen.add(i) {
			return false
		}
		if i >= len(tiers) {
			v, ok := r.value()
			return ok && json.Unmarshal(v, others[i-len(tiers)]) == nil
		}
		if r.null() {
			return true
		}
		split := s.split
		if i >= 3 {
			split = nil // clamp tiers: parseClampSpec reads them
		}
		var ok bool
		*tiers[i], ok = r.hooks(split)
		return ok
	})
	return s, ok
}
