package serve

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"math/bits"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// A packed blob's rows decoded in one pass. encoding/base64 decodes at a few hundred MB/s
// here, then vecfile converts the bytes to floats in a second pass; fastPackedVectors decodes
// four base64 characters with four table loads and ORs, checks the whole string for a
// character outside the alphabet once at the end, and converts each row as it goes. It takes
// only what vecfile's decoder takes, with the same floats: a float16 blob, a shape vecfile
// refuses, a string that is not exactly the padded encoding of the rows, or a character that
// is not base64 gives !ok, and the caller decodes with vecfile (for its result or its error).
// TestFastPackedVectorsMatch and FuzzFastPackedVectors hold it to that.

// b64Bad marks a character outside the standard alphabet in the b64Quad tables.
const b64Bad = 1 << 31

// b64Quad[k][c] is character c's 6 bits at position k of a quantum, in place in its 24 bits
// (b64Bad for a character that is not base64, '=' included).
var b64Quad = func() (t [4][256]uint32) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for k := range t {
		for c := range t[k] {
			t[k][c] = b64Bad
		}
		for v, c := range []byte(alphabet) {
			t[k][c] = uint32(v) << (18 - 6*k)
		}
	}
	return t
}()

// decodeBase64 decodes src, the padded standard encoding of exactly len(dst) bytes, into dst;
// false if src is not that (the caller asks encoding/base64 for the error).
func decodeBase64[S ~string | ~[]byte](dst []byte, src S) bool {
	if len(src) != base64.StdEncoding.EncodedLen(len(dst)) || len(src) == 0 {
		return false
	}
	// every whole quantum but the last: 3 bytes from 4 characters
	body := len(src) - 4
	var bad uint32
	for i, o := 0, 0; i < body; i, o = i+4, o+3 {
		q := b64Quad[0][src[i]] | b64Quad[1][src[i+1]] | b64Quad[2][src[i+2]] | b64Quad[3][src[i+3]]
		bad |= q
		d := dst[o : o+3 : o+3]
		d[0], d[1], d[2] = byte(q>>16), byte(q>>8), byte(q)
	}
	if bad&b64Bad != 0 {
		return false
	}
	// the last quantum, padding and all, as encoding/base64 reads it
	var tail [3]byte
	n, err := base64.StdEncoding.Decode(tail[:], []byte(src[body:]))
	return err == nil && copy(dst[body/4*3:], tail[:n]) == n && body/4*3+n == len(dst)
}

// decodeFloat32 decodes src, the padded standard encoding of len(dst) little-endian float32,
// into dst without an intermediate byte buffer: 16 characters are 12 bytes, 3 floats. false
// as decodeBase64's.
func decodeFloat32[S ~string | ~[]byte](dst []float32, src S) bool {
	if len(src) != base64.StdEncoding.EncodedLen(4*len(dst)) {
		return false
	}
	groups := len(dst) / 3
	if len(dst)%3 == 0 && groups > 0 {
		groups-- // the last group holds the final quantum: decodeBase64 reads it
	}
	t0, t1, t2, t3 := &b64Quad[0], &b64Quad[1], &b64Quad[2], &b64Quad[3]
	var bad uint32
	for g := range groups {
		s := src[16*g : 16*g+16]
		q0 := t0[s[0]] | t1[s[1]] | t2[s[2]] | t3[s[3]]
		q1 := t0[s[4]] | t1[s[5]] | t2[s[6]] | t3[s[7]]
		q2 := t0[s[8]] | t1[s[9]] | t2[s[10]] | t3[s[11]]
		q3 := t0[s[12]] | t1[s[13]] | t2[s[14]] | t3[s[15]]
		bad |= q0 | q1 | q2 | q3
		// bytes q0[2..0] q1[2..0] q2[2..0] q3[2..0], read as three little-endian words
		d := dst[3*g : 3*g+3 : 3*g+3]
		d[0] = math.Float32frombits(bits.ReverseBytes32(q0<<8 | q1>>16&0xff))
		d[1] = math.Float32frombits(bits.ReverseBytes32(q1<<16 | q2>>8&0xffff))
		d[2] = math.Float32frombits(bits.ReverseBytes32(q2<<24 | q3&0xffffff))
	}
	if bad&b64Bad != 0 {
		return false
	}
	rest := dst[3*groups:]
	var tail [12]byte
	if !decodeBase64(tail[:4*len(rest)], src[16*groups:]) {
		return false
	}
	for i := range rest {
		rest[i] = math.Float32frombits(binary.LittleEndian.Uint32(tail[4*i:]))
	}
	return true
}

// fastDtypes are the dtypes fastPackedVectors converts: element size and converter.
var fastDtypes = map[string]struct {
	size int
	conv func([]float32, []byte)
}{
	"float32": {4, func(dst []float32, raw []byte) {
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	}},
	"bfloat16": {2, func(dst []float32, raw []byte) {
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(raw[2*i:])) << 16)
		}
	}},
	"float64": {8, func(dst []float32, raw []byte) {
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
		}
	}},
}

// fastPackedVectors is p.Vectors(hook) for a well-formed blob whose base64 is data (p.Data,
// or the bytes taken from a body), or !ok (see above).
func fastPackedVectors[S ~string | ~[]byte](p *vecfile.Packed, data S, hook string) ([]steer.Vector, bool) {
	dt, ok := fastDtypes[p.Dtype]
	if !ok || len(p.Shape) != 2 {
		return nil, false
	}
	rows, h := p.Shape[0], p.Shape[1]
	if rows < 1 || h < 1 || rows > 1<<20 || h > 1<<24 || len(p.LayerIndices) != rows ||
		p.Scales != nil && len(p.Scales) != rows {
		return nil, false
	}
	for _, l := range p.LayerIndices {
		if l < 0 {
			return nil, false
		}
	}
	flat := make([]float32, rows*h)
	if p.Dtype == "float32" {
		if !decodeFloat32(flat, data) {
			return nil, false
		}
	} else {
		raw := make([]byte, rows*h*dt.size)
		if !decodeBase64(raw, data) {
			return nil, false
		}
		dt.conv(flat, raw)
	}
	out := make([]steer.Vector, rows)
	for r := range out {
		out[r] = steer.Vector{Hook: hook, Layer: p.LayerIndices[r], Scale: 1, Data: flat[r*h : (r+1)*h : (r+1)*h]}
		if p.Scales != nil {
			out[r].Scale = float32(p.Scales[r])
		}
	}
	return out, true
}
