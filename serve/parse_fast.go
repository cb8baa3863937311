package serve

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

// A fast reader for the bodies that carry packed blobs. encoding/json runs every byte of a
// value through its scanner's state machine each time the value is scanned, and a body goes
// through it several times on its way to a packed blob's data (the decoder's read, the struct
// decode, each json.RawMessage level): for 32 layers × 4096 float32 (700 KB of base64) that was
// most of an admission's 15 ms. jsonReader walks a body once with jsontext's streaming decoder
// (go-json-experiment/json, the proposed encoding/json/v2's syntax layer), descending into the
// objects the caller names and handing out every other value as a slice of the body. It takes
// only input encoding/json takes, with the same result: anything it does not take (a key with
// an escape or a byte outside ASCII, a struct field given twice or unknown, a type mismatch,
// invalid JSON) makes the caller report !ok and decode with encoding/json as before, for its
// result or its error. FuzzFastAdmitRequest, FuzzRawObject and FuzzFastFloats hold it to that.
//
// It replaced a hand-written reader (bytes.IndexByte for string ends, control bytes checked 8
// at a time) that was faster on long strings, jsontext's loop going a byte a step: for the
// body above, BenchmarkAdmitParse (parse only) takes 1.2-1.5x the hand reader's time and
// BenchmarkAdmitHTTP/packed (an admission over HTTP) 1.10x, medians of per-round ratios, the
// two alternated 9 rounds on a loaded 2-core machine. A library before our own tokenizer.

// jsonReader reads one JSON document with jsontext as encoding/json reads it: duplicate names
// and invalid UTF-8 are taken (encoding/json takes them), values are slices of the document.
type jsonReader struct {
	d   *jsontext.Decoder
	doc []byte
}

func newJSONReader(doc []byte) *jsonReader {
	// A bytes.Buffer is parsed in place, without a copy into the decoder's buffer.
	d := jsontext.NewDecoder(bytes.NewBuffer(doc), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	return &jsonReader{d, doc}
}

// object reads an object, calling member with each key; member reads the key's value (with
// value, null, object or fields). false if the next value is not an object, a key is not plainKey,
// or member returns false.
func (r *jsonReader) object(member func(key string) bool) bool {
	if r.d.PeekKind() != '{' {
		return false
	}
	if _, err := r.d.ReadToken(); err != nil {
		return false
	}
	for r.d.PeekKind() != '}' {
		name, err := r.d.ReadValue()
		if err != nil || !plainKey(name) || !member(string(name[1:len(name)-1])) {
			return false
		}
	}
	_, err := r.d.ReadToken()
	return err == nil
}

// value reads the next value, giving its bytes in the document.
func (r *jsonReader) value() ([]byte, bool) {
	v, err := r.d.ReadValue()
	if err != nil {
		return nil, false
	}
	end := int(r.d.InputOffset())
	return r.doc[end-len(v) : end : end], true
}

// null reads the next value if it is null, reporting whether it was.
func (r *jsonReader) null() bool {
	if r.d.PeekKind() != 'n' {
		return false
	}
	_, err := r.d.ReadToken()
	return err == nil
}

// end reports whether nothing but space follows the value read.
func (r *jsonReader) end() bool {
	_, err := r.d.ReadToken()
	return err == io.EOF
}

// plainKey reports whether a quoted key is printable ASCII without an escape: encoding/json
// gives exactly the bytes between its quotes as the key.
func plainKey(k []byte) bool {
	if len(k) < 2 {
		return false
	}
	for _, c := range k[1 : len(k)-1] {
		if c < 0x20 || c >= 0x80 || c == '\\' {
			return false
		}
	}
	return true
}

// fields reads an object into a map of its members' values (a later duplicate key wins, as
// with encoding/json), giving also the object's bytes in the document.
func (r *jsonReader) fields() ([]byte, map[string]json.RawMessage, bool) {
	start := int(r.d.InputOffset()) // the end of what was read before: space, ':' or ',' follow
	m := map[string]json.RawMessage{}
	ok := r.object(func(key string) bool {
		v, ok := r.value()
		m[key] = v
		return ok
	})
	if !ok {
		return nil, nil, false
	}
	end := int(r.d.InputOffset())
	return bytes.TrimLeft(r.doc[start:end:end], " \t\r\n:,"), m, true
}

// hooks reads a tier, an object of hooks, into a map of its values; each value that is an
// object is split into its fields into split on the way (by the address of its first byte),
// unless split is nil.
func (r *jsonReader) hooks(split map[*byte]map[string]json.RawMessage) (map[string]json.RawMessage, bool) {
	m := map[string]json.RawMessage{}
	ok := r.object(func(hook string) bool {
		if split == nil || r.d.PeekKind() != '{' {
			v, ok := r.value()
			m[hook] = v
			return ok
		}
		v, fields, ok := r.fields()
		if ok {
			m[hook] = v
			split[&v[0]] = fields
		}
		return ok
	})
	return m, ok
}

// rawObject is json.Unmarshal(b, &m) for m a map[string]json.RawMessage, with one pass of
// jsontext over b: a later duplicate key wins; the values alias b (encoding/json copies them).
// ok is false for anything but one object with plainKey keys (the caller then asks
// encoding/json).
func rawObject(b []byte) (map[string]json.RawMessage, bool) {
	r := newJSONReader(b)
	_, m, ok := r.fields()
	return m, ok && r.end()
}

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
// with one pass of jsontext: it checks each number against JSON's grammar, and
// strconv.ParseFloat(s, 32) parses it, as encoding/json does.
func fastFloats(raw []byte) ([]float32, bool) {
	r := newJSONReader(raw)
	if r.d.PeekKind() != '[' {
		return nil, false
	}
	if _, err := r.d.ReadToken(); err != nil {
		return nil, false
	}
	d := make([]float32, 0, len(raw)/8)
	for r.d.PeekKind() == '0' {
		v, err := r.d.ReadValue()
		if err != nil {
			return nil, false
		}
		f, err := strconv.ParseFloat(string(v), 32)
		if err != nil {
			return nil, false
		}
		d = append(d, float32(f))
	}
	if r.d.PeekKind() != ']' {
		return nil, false
	}
	_, err := r.d.ReadToken()
	return d, err == nil && r.end()
}
