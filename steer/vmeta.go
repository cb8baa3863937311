package steer

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// A named steering vector's metadata: today its model hint (the architecture a vector file
// says it was made for, GGUF's controlvector.model_hint). It is stored in the region under
// KindVectorMeta, key = the vector's name, in the same update as the vector (Register writes
// or removes it, Unregister removes it), and only when there is any: readers of vectors never
// look at it, so the step and Vector reads are unchanged.
//
//	"SVMD" | u8 format version (1) | u8 0 | u16 hint length | hint (UTF-8)
//
// The encoding delimits itself (DecodeVectorMeta reports its length), so the mirror puts it in
// front of a vector's wire encoding. FuzzDecodeVectorMeta exercises the decoder.

// KindVectorMeta holds a named steering vector's metadata, key = name.
const KindVectorMeta shm.Kind = proto.KindVectorMeta

// MaxModelHint is the longest model hint, in bytes.
const MaxModelHint = 256

// VectorMetaMagic starts every metadata encoding.
const VectorMetaMagic = "SVMD"

const (
	vmetaVersion = 1
	vmetaHdr     = 8
)

// ErrBadModelHint means a model hint is longer than MaxModelHint bytes, not valid UTF-8, or has
// a non-printable character (a control character, a line break): give the architecture name
// as one printable line, such as "llama". Nothing was changed.
var ErrBadModelHint = errors.New("shmsteer: bad model hint")

// VectorMeta is a named steering vector's metadata.
type VectorMeta struct {
	// ModelHint is the model architecture the vector was made for ("" if unknown).
	ModelHint string
}

// CheckModelHint validates a model hint (ErrBadModelHint).
func CheckModelHint(h string) error {
	switch {
	case len(h) > MaxModelHint:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrBadModelHint, len(h), MaxModelHint)
	case !utf8.ValidString(h):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrBadModelHint, h)
	}
	for _, r := range h {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %q has the non-printable character %U", ErrBadModelHint, h, r)
		}
	}
	return nil
}

// ModelHint gives Register's vector the model hint h (validated: ErrBadModelHint). A
// Register without it stores the vector without a hint (the hint belongs to the version
// registered). Only for steering vectors: RegisterProbe refuses it.
func ModelHint(h string) WriteOption {
	return func(o *writeOpts) { o.hint, o.hintSet = h, true }
}

// EncodeVectorMeta encodes m (nil when it holds nothing).
func EncodeVectorMeta(m VectorMeta) []byte {
	if m.ModelHint == "" {
		return nil
	}
	b := make([]byte, vmetaHdr, vmetaHdr+len(m.ModelHint))
	copy(b, VectorMetaMagic)
	b[4] = vmetaVersion
	le.PutUint16(b[6:], uint16(len(m.ModelHint)))
	return append(b, m.ModelHint...)
}

// DecodeVectorMeta reads a metadata encoding at the start of b and returns it with the number
// of bytes it takes; every field is checked (ErrBadEncoding, ErrBadModelHint).
func DecodeVectorMeta(b []byte) (VectorMeta, int, error) {
	bad := func(format string, args ...any) (VectorMeta, int, error) {
		return VectorMeta{}, 0, fmt.Errorf("%w: vector metadata: "+format, append([]any{ErrBadEncoding}, args...)...)
	}
	if len(b) < vmetaHdr || string(b[:4]) != VectorMetaMagic {
		return bad("no header")
	}
	if b[4] != vmetaVersion {
		return bad("format version %d, this build reads %d", b[4], vmetaVersion)
	}
	if b[5] != 0 {
		return bad("reserved byte set")
	}
	n := int(le.Uint16(b[6:]))
	if n == 0 || n > len(b)-vmetaHdr {
		return bad("hint of %d bytes in %d", n, len(b)-vmetaHdr)
	}
	h := string(b[vmetaHdr : vmetaHdr+n])
	if err := CheckModelHint(h); err != nil {
		return VectorMeta{}, 0, err
	}
	return VectorMeta{ModelHint: h}, vmetaHdr + n, nil
}

// VectorMeta reads named steering vector name's metadata at snapshot s (zero when it has
// none, or when there is no such vector).
func (e *Engine) VectorMeta(s *shm.Snapshot, name string) (VectorMeta, error) {
	b, _, err := s.View(KindVectorMeta, name)
	if errors.Is(err, shm.ErrNotFound) {
		return VectorMeta{}, nil
	} else if err != nil {
		return VectorMeta{}, err
	}
	m, n, err := DecodeVectorMeta(b)
	if err == nil && n != len(b) {
		err = fmt.Errorf("%w: vector metadata: %d trailing bytes", ErrBadEncoding, len(b)-n)
	}
	if err != nil {
		return VectorMeta{}, fmt.Errorf("named vector %q: %w", name, err)
	}
	return m, nil
}

// putVectorMeta writes (or, for a vector without metadata or unregistered, removes) name's
// metadata inside the vector's update.
func putVectorMeta(tx *shm.Tx, name string, enc []byte) error {
	if enc != nil {
		return tx.Put(KindVectorMeta, name, enc)
	}
	if err := tx.Delete(KindVectorMeta, name); err != nil && !errors.Is(err, shm.ErrNotFound) {
		return err
	}
	return nil
}
