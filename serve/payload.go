package serve

import (
	"bytes"
	"encoding/json"

	"github.com/shmsteer/shmsteer/steer"
)

// decodePayload is decodeStrict for a steering payload (/set, modules): the fork words its
// errors "Malformed steering payload". A body that is JSON but for NaN, Infinity or -Infinity
// tokens (Python's json.loads takes them, so the fork answers them as non-finite values) is
// refused as non-finite (steer.ErrNonFinite), as the fork does, not as invalid JSON.
func decodePayload(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		if tok, off, ok := nonFiniteToken(b); ok {
			return malformedAs(steer.ErrNonFinite, "", "the value %s at byte %d is non-finite: steering values must be finite", tok, off)
		}
		return malformed("", "%s", describeJSONError(err))
	}
	if d.More() {
		return malformed("", "trailing data after the JSON body")
	}
	return nil
}

// nonFiniteTokens are the non-finite number tokens Python's json module reads and writes.
var nonFiniteTokens = []string{"-Infinity", "Infinity", "NaN"}

// nonFiniteToken reports the first NaN, Infinity or -Infinity token outside a string in b and
// its byte offset, when b is valid JSON with every such token read as 0 (so a body that is
// broken anyway keeps its syntax error).
func nonFiniteToken(b []byte) (tok string, off int, ok bool) {
	fixed := make([]byte, 0, len(b))
	inStr, esc := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inStr:
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
		case c == '"':
			inStr = true
		default:
			if t := tokenAt(b[i:]); t != "" {
				if tok == "" {
					tok, off = t, i
				}
				fixed = append(fixed, '0')
				i += len(t) - 1
				continue
			}
		}
		fixed = append(fixed, c)
	}
	return tok, off, tok != "" && json.Valid(fixed)
}

// tokenAt returns the non-finite token b starts with ("" for none).
func tokenAt(b []byte) string {
	for _, t := range nonFiniteTokens {
		if bytes.HasPrefix(b, []byte(t)) {
			return t
		}
	}
	return ""
}
