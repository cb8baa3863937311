package serve

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strconv"
)

// A fast reader for the bodies that carry packed blobs. encoding/json runs every byte of a
// value through its scanner's state machine each time the value is scanned, and a body goes
// through it several times on its way to a packed blob's data (the decoder's read, the struct
// decode, each json.RawMessage level): for 32 layers × 4096 float32 (700 KB of base64) that was
// most of an admission's 15 ms. The functions here validate and split JSON with a string loop
// that moves 8 bytes a step, and take only input encoding/json takes, with the same result:
// anything they do not take (a key with an escape or a byte outside ASCII, a duplicate or
// unknown field, a type mismatch, nesting deeper than fastMaxDepth, invalid JSON) makes them
// report !ok, and the caller decodes with encoding/json as before, for its result or its error.
// FuzzFastAdmitRequest and FuzzRawObject hold them to that.

// fastMaxDepth bounds the nesting the fast reader follows (encoding/json's limit is 10000).
const fastMaxDepth = 64

// rawField is one member of a JSON object: its key and its value's bytes.
type rawField struct {
	key string
	val []byte
}

const (
	lsb8 = 0x0101010101010101
	msb8 = 0x8080808080808080
)

// hasControl reports whether s holds a byte below 0x20 (not allowed unescaped in a JSON
// string), 8 bytes a step.
func hasControl(s []byte) bool {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := binary.LittleEndian.Uint64(s[i:])
		if (w-lsb8*0x20)&^w&msb8 != 0 {
			return true
		}
	}
	for ; i < len(s); i++ {
		if s[i] < 0x20 {
			return true
		}
	}
	return false
}

// skipString validates the JSON string starting at b[i] == '"' and returns the index after
// its closing quote. The quotes and backslashes are found with bytes.IndexByte; the text
// between them is checked for control bytes 8 at a time. Each byte is searched a bounded
// number of times: q, the next quote, is searched for again only after an escape took it.
// A trusted string (in a value already validated) is only searched for its closing quote.
func skipString(b []byte, i int, trusted bool) (int, bool) {
	if trusted {
		return skipTrustedString(b, i)
	}
	i++
	q := -1
	for {
		if q < i {
			k := bytes.IndexByte(b[i:], '"')
			if k < 0 {
				return 0, false
			}
			q = i + k
		}
		seg := b[i:q]
		bs := bytes.IndexByte(seg, '\\')
		if bs < 0 {
			return q + 1, !hasControl(seg)
		}
		if hasControl(seg[:bs]) {
			return 0, false
		}
		n, ok := skipEscape(b, i+bs)
		if !ok {
			return 0, false
		}
		i = n
	}
}

// skipTrustedString finds the end of the valid JSON string at b[i] == '"': the first quote
// after it not escaped by an odd run of backslashes.
func skipTrustedString(b []byte, i int) (int, bool) {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, false
		}
		q := j + k
		n := 0
		for q-1-n > i && b[q-1-n] == '\\' {
			n++
		}
		if n%2 == 0 {
			return q + 1, true
		}
		j = q + 1
	}
}

// skipEscape validates the escape at b[i] == '\\' and returns the index after it.
func skipEscape(b []byte, i int) (int, bool) {
	if i+1 >= len(b) {
		return 0, false
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2, true
	case 'u':
		if i+6 > len(b) {
			return 0, false
		}
		for _, h := range b[i+2 : i+6] {
			if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
				return 0, false
			}
		}
		return i + 6, true
	}
	return 0, false
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// skipDigits returns the index after the run of digits at b[i:] and whether there was one.
func skipDigits(b []byte, i int) (int, bool) {
	j := i
	for j < len(b) && isDigit(b[j]) {
		j++
	}
	return j, j > i
}

// skipNumber validates the JSON number at b[i:] and returns the index after it.
func skipNumber(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && isDigit(b[i]):
		i, _ = skipDigits(b, i)
	default:
		return 0, false
	}
	var ok bool
	if i < len(b) && b[i] == '.' {
		if i, ok = skipDigits(b, i+1); !ok {
			return 0, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i, ok = skipDigits(b, i); !ok {
			return 0, false
		}
	}
	return i, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue validates the JSON value at b[i:] (no leading space) and returns the index after
// it; a trusted value's strings are only searched for their end (skipString).
func skipValue(b []byte, i, depth int, trusted bool) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; {
	case c == '"':
		return skipString(b, i, trusted)
	case c == '{' || c == '[':
		return skipContainer(b, i, depth+1, trusted)
	case c == '-' || isDigit(c):
		return skipNumber(b, i)
	}
	for _, lit := range []string{"true", "false", "null"} {
		if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
			return i + len(lit), true
		}
	}
	return 0, false
}

// skipContainer validates the object or array at b[i:] and returns the index after it.
func skipContainer(b []byte, i, depth int, trusted bool) (int, bool) {
	if depth > fastMaxDepth {
		return 0, false
	}
	obj := b[i] == '{'
	closing := byte(']')
	if obj {
		closing = '}'
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == closing {
		return i + 1, true
	}
	for {
		var ok bool
		if obj {
			if i >= len(b) || b[i] != '"' {
				return 0, false
			}
			if i, ok = skipString(b, i, trusted); !ok {
				return 0, false
			}
			if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
				return 0, false
			}
			i = skipSpace(b, i+1)
		}
		if i, ok = skipValue(b, i, depth, trusted); !ok {
			return 0, false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return 0, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case closing:
			return i + 1, true
		default:
			return 0, false
		}
	}
}

// plainKey reports whether a key's bytes (between its quotes) are printable ASCII without an
// escape: encoding/json gives exactly these bytes as the key.
func plainKey(k []byte) bool {
	for _, c := range k {
		if c < 0x20 || c >= 0x80 || c == '\\' {
			return false
		}
	}
	return true
}

// splitObject splits b, one JSON object with nothing but space around it, into its members
// in order; ok is false for anything else or a key that is not plainKey. trusted says b is a
// value encoding/json or this reader has validated already: its strings are not checked again.
func splitObject(b []byte, trusted bool) ([]rawField, bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	var out []rawField
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return out, skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		end, ok := skipString(b, i, trusted)
		if !ok || !plainKey(b[i+1:end-1]) {
			return nil, false
		}
		key := string(b[i+1 : end-1])
		if i = skipSpace(b, end); i >= len(b) || b[i] != ':' {
			return nil, false
		}
		start := skipSpace(b, i+1)
		if i, ok = skipValue(b, start, 1, trusted); !ok {
			return nil, false
		}
		out = append(out, rawField{key, b[start:i]})
		if i = skipSpace(b, i); i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return out, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// rawObject is json.Unmarshal(b, &m) for m a map[string]json.RawMessage, without scanning
// b's strings twice: a later duplicate key wins; the values alias b (encoding/json copies
// them). ok is false where splitObject's is (the caller then asks encoding/json); trusted as
// splitObject's.
func rawObject(b []byte, trusted bool) (map[string]json.RawMessage, bool) {
	fields, ok := splitObject(b, trusted)
	if !ok {
		return nil, false
	}
	m := make(map[string]json.RawMessage, len(fields))
	for _, f := range fields {
		m[f.key] = f.val
	}
	return m, true
}

// isNull reports whether a value's bytes are JSON null.
func isNull(v []byte) bool { return string(v) == "null" }

// fieldSet tracks which of up to 64 named fields an object gave, to refuse duplicates.
type fieldSet uint64

// add marks field i given, reporting false if it was already.
func (s *fieldSet) add(i int) bool {
	bit := fieldSet(1) << i
	if *s&bit != 0 {
		return false
	}
	*s |= bit
	return true
}

// fastFloats is json.Unmarshal(raw, &d) for d a []float32 when raw is an array of numbers
// that all fit float32 (ok false otherwise: null elements, other types, overflow, bad JSON),
// without encoding/json's scanner: each number is checked against JSON's grammar and parsed
// by strconv.ParseFloat(s, 32), as encoding/json parses it.
func fastFloats(raw []byte) ([]float32, bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, false
	}
	d := make([]float32, 0, len(raw)/8)
	if i = skipSpace(raw, i+1); i < len(raw) && raw[i] == ']' {
		return d, skipSpace(raw, i+1) == len(raw)
	}
	for {
		j, ok := skipNumber(raw, i)
		if !ok {
			return nil, false
		}
		f, err := strconv.ParseFloat(string(raw[i:j]), 32)
		if err != nil {
			return nil, false
		}
		d = append(d, float32(f))
		if i = skipSpace(raw, j); i >= len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return d, skipSpace(raw, i+1) == len(raw)
		default:
			return nil, false
		}
	}
}
