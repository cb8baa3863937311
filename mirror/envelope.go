package mirror

import (
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"

	"golang.org/x/crypto/chacha20poly1305"

	"github.com/shmsteer/shmsteer/steer"
)

// Entry kinds.
const (
	kindVector byte = 1
	kindGlobal byte = 2
	kindKey    byte = 3
	kindProbe  byte = 4 // a probe vector (steer.KindProbe): a named vector of kind "probe"
	// kindConversation is a conversation's rest_of_conversation gates (steer's SGCV entry).
	kindConversation byte = 5
)

// Envelope flags.
const (
	flagDeleted  byte = 1 // the entry was deleted (vector unregistered, global cleared, key revoked)
	flagSealed   byte = 2 // payload is nonce || AEAD ciphertext
	flagExternal byte = 4 // payload names an object in the object store (objectRef)
	flagPurge    byte = 8 // a purge marker: its host removed a revoked key's or a dropped conversation's tombstone
	knownFlags        = flagDeleted | flagSealed | flagExternal | flagPurge
)

// magic names the format: "SMR2" values are authenticated (tagSize bytes of HMAC at the end);
// "SMR1" values (shmsteer before the hardening of the mirror) carry no tag and are refused.
var (
	magic    = [4]byte{'S', 'M', 'R', '2'}
	magicOld = [4]byte{'S', 'M', 'R', '1'}
)

const (
	maxOrigin = 128 // bounds a host id
	tagSize   = sha256.Size
)

// envelope is the header every bucket value starts with, followed by the payload and the tag:
//
//	magic "SMR2" | flags u8 | kind u8 | origin len u8 | origin | incarnation u64 | seq u64 | payload | tag [32]
//
// tag = HMAC-SHA256(key derived from the secret, entry name || 0 || everything before the tag):
// the value is bound to its entry and its origin. seq is the origin's clock (see Mirror.nextSeq):
// it increases with every value a host publishes, across its restarts, so a host refuses a value
// of an origin not newer than the newest of that origin's it has taken (a replay).
type envelope struct {
	flags       byte
	kind        byte
	origin      string // host id
	incarnation uint64 // random per Start: tells this process's own echoes from its earlier life's
	seq         uint64 // the origin's clock, increasing over all its values
	payload     []byte
}

func (e *envelope) header() []byte {
	b := make([]byte, 0, 4+3+len(e.origin)+16)
	b = append(b, magic[:]...)
	b = append(b, e.flags, e.kind, byte(len(e.origin)))
	b = append(b, e.origin...)
	b = binary.LittleEndian.AppendUint64(b, e.incarnation)
	return binary.LittleEndian.AppendUint64(b, e.seq)
}

// decodeEnvelope parses a bucket value without authenticating it (signer.open does both); the
// payload aliases b and excludes the tag.
func decodeEnvelope(b []byte) (envelope, int, error) {
	var e envelope
	bad := func(what string) (envelope, int, error) {
		return envelope{}, 0, fmt.Errorf("%w: %s", ErrBadEnvelope, what)
	}
	if len(b) >= 4 && [4]byte(b[:4]) == magicOld {
		return envelope{}, 0, ErrOldFormat
	}
	if len(b) < 7 || [4]byte(b[:4]) != magic {
		return bad("no mirror header (written by another tool)")
	}
	e.flags, e.kind = b[4], b[5]
	if e.flags&^knownFlags != 0 {
		return bad(fmt.Sprintf("unknown flags %#x", e.flags))
	}
	if e.kind < kindVector || e.kind > kindConversation {
		return bad(fmt.Sprintf("unknown kind %d", e.kind))
	}
	n := int(b[6])
	if n == 0 || n > maxOrigin || len(b) < 7+n+16+tagSize {
		return bad("truncated header")
	}
	e.origin = string(b[7 : 7+n])
	e.incarnation = binary.LittleEndian.Uint64(b[7+n:])
	e.seq = binary.LittleEndian.Uint64(b[15+n:])
	hdr := 23 + n
	e.payload = b[hdr : len(b)-tagSize]
	return e, hdr, nil
}

// signer authenticates every bucket value under a key derived from the deployment's secret.
type signer struct{ key []byte }

func (s *signer) tag(ek string, msg []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(ek))
	m.Write([]byte{0})
	m.Write(msg)
	return m.Sum(nil)
}

// sign encodes e as the value of entry ek: header, payload, tag.
func (s *signer) sign(ek string, e *envelope) []byte {
	b := append(e.header(), e.payload...)
	return append(b, s.tag(ek, b)...)
}

// open decodes and authenticates the value b of entry ek: ErrOldFormat, ErrBadEnvelope, or
// ErrTampered for a value without this deployment's tag (no secret, another secret, modified,
// moved from another entry). Nothing of an unauthenticated value is returned.
func (s *signer) open(ek string, b []byte) (envelope, int, error) {
	if len(b) == 0 {
		return envelope{}, 0, fmt.Errorf("%w: an empty value or a plain delete", ErrTampered)
	}
	e, hdr, err := decodeEnvelope(b)
	if err != nil {
		return envelope{}, 0, err
	}
	body := b[:len(b)-tagSize]
	if !hmac.Equal(s.tag(ek, body), b[len(body):]) {
		return envelope{}, 0, fmt.Errorf("%w: entry %s", ErrTampered, ek)
	}
	return e, hdr, nil
}

// objectRef is the payload of an external value: the object's name and the sha256 of its
// bytes (the object store checks its own digest on read too; this binds the pointer to one
// content).
type objectRef struct {
	name string
	sum  [32]byte
	size uint64
}

func (r objectRef) encode() []byte {
	b := append([]byte{byte(len(r.name))}, r.name...)
	b = append(b, r.sum[:]...)
	return binary.LittleEndian.AppendUint64(b, r.size)
}

func decodeObjectRef(b []byte) (objectRef, error) {
	if len(b) < 1 || len(b) != 1+int(b[0])+32+8 {
		return objectRef{}, fmt.Errorf("%w: bad object reference", ErrBadEnvelope)
	}
	n := int(b[0])
	r := objectRef{name: string(b[1 : 1+n])}
	copy(r.sum[:], b[1+n:])
	r.size = binary.LittleEndian.Uint64(b[33+n:])
	return r, nil
}

// Bucket entry names. KV keys allow [-_=.a-zA-Z0-9]: names are base64url-encoded.
const globalEntry = "g"

func vectorEntry(name string) string {
	return "v." + base64.RawURLEncoding.EncodeToString([]byte(name))
}

// probeEntry names a probe vector's entry: probes and steering vectors are apart, as in the
// region.
func probeEntry(name string) string {
	return "p." + base64.RawURLEncoding.EncodeToString([]byte(name))
}

// conversationEntry names a conversation's gates' entry (name: steer.GateConversationName).
func conversationEntry(name string) string {
	return "c." + base64.RawURLEncoding.EncodeToString([]byte(name))
}

// entryName returns the kind and, for vectors and conversations, the name an entry key stands
// for.
func entryName(ek string) (kind byte, name string, ok bool) {
	switch {
	case ek == globalEntry:
		return kindGlobal, "", true
	case len(ek) > 2 && ek[:2] == "c.":
		b, err := base64.RawURLEncoding.DecodeString(ek[2:])
		_, valid := steer.ParseGateConversationName(string(b))
		return kindConversation, string(b), err == nil && valid
	case len(ek) > 2 && (ek[:2] == "v." || ek[:2] == "p."):
		b, err := base64.RawURLEncoding.DecodeString(ek[2:])
		kind = kindVector
		if ek[0] == 'p' {
			kind = kindProbe
		}
		return kind, string(b), err == nil && len(b) > 0
	case len(ek) > 2 && ek[:2] == "k.":
		return kindKey, "", true
	}
	return 0, "", false
}

// sealer seals key registry values and names their entries without revealing the id.
type sealer struct {
	aead  cipher.AEAD
	idKey []byte
}

// Purposes passed to ipc.Secret.DeriveKey.
const (
	purposeSeal = "shmsteer/mirror/seal/v1"
	purposeID   = "shmsteer/mirror/id/v1"
	purposeMAC  = "shmsteer/mirror/mac/v2"
)

func newSealer(sealKey, idKey []byte) (*sealer, error) {
	a, err := chacha20poly1305.New(sealKey)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: a, idKey: idKey}, nil
}

func (s *sealer) keyEntry(id string) string {
	m := hmac.New(sha256.New, s.idKey)
	m.Write([]byte(id))
	return "k." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Key plaintext: id len u16 | id | state u8 (stateLive/stateRevoked) | key bytes.
const (
	stateLive    byte = 1
	stateRevoked byte = 2
)

// seal encrypts (id, state, key) for entry ek; the envelope header and the entry name are
// authenticated, so a value moved to another entry or re-attributed to another host fails.
func (s *sealer) seal(ek string, hdr []byte, id string, state byte, key []byte) []byte {
	pt := make([]byte, 0, 3+len(id)+len(key))
	pt = binary.LittleEndian.AppendUint16(pt, uint16(len(id)))
	pt = append(append(append(pt, id...), state), key...)
	nonce := make([]byte, chacha20poly1305.NonceSize)
	if _, err := rand.Read(nonce); err != nil {
		panic("shmsteer: crypto/rand failed: " + err.Error())
	}
	out := s.aead.Seal(nonce, nonce, pt, aad(ek, hdr))
	clear(pt)
	return out
}

func aad(ek string, hdr []byte) []byte { return append([]byte(ek+"\x00"), hdr...) }

// open authenticates and decrypts a sealed payload; ErrTampered on any failure.
func (s *sealer) open(ek string, hdr, payload []byte) (id string, state byte, key []byte, err error) {
	ns := chacha20poly1305.NonceSize
	if len(payload) < ns+s.aead.Overhead() {
		return "", 0, nil, fmt.Errorf("%w: sealed value of %d bytes", ErrTampered, len(payload))
	}
	pt, err := s.aead.Open(nil, payload[:ns], payload[ns:], aad(ek, hdr))
	if err != nil {
		return "", 0, nil, ErrTampered
	}
	if len(pt) < 3 || len(pt) < 3+int(binary.LittleEndian.Uint16(pt)) {
		clear(pt)
		return "", 0, nil, fmt.Errorf("%w: short sealed plaintext", ErrBadEnvelope)
	}
	n := int(binary.LittleEndian.Uint16(pt))
	id, state, key = string(pt[2:2+n]), pt[2+n], pt[3+n:]
	if s.keyEntry(id) != ek {
		clear(pt)
		return "", 0, nil, fmt.Errorf("%w: sealed id does not match its entry", ErrTampered)
	}
	if state != stateLive && state != stateRevoked {
		clear(pt)
		return "", 0, nil, fmt.Errorf("%w: key state %d", ErrBadEnvelope, state)
	}
	return id, state, key, nil
}
