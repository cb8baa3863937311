package vecfile

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// The builders below write files byte by byte from the format specifications, independently
// of this package's writers, so the readers are not only tested against themselves.

// ggufKV is one metadata entry for ggufBuilder.
type ggufKV struct {
	key string
	typ uint32
	val []byte // encoded value
}

func ggufStr(s string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(s))), s...)
}

func kvString(key, v string) ggufKV { return ggufKV{key, ggufString, ggufStr(v)} }
func kvI32(key string, v int32) ggufKV {
	return ggufKV{key, ggufI32, binary.LittleEndian.AppendUint32(nil, uint32(v))}
}
func kvU32(key string, v uint32) ggufKV {
	return ggufKV{key, ggufU32, binary.LittleEndian.AppendUint32(nil, v)}
}

// ggufT is one tensor for ggufBuilder; data is raw little-endian bytes.
type ggufT struct {
	name string
	dims []uint64
	typ  uint32
	data []byte
}

// buildGGUF lays out a GGUF v3 file: header, kvs, tensor infos, padding to align, data with
// each tensor padded to align.
func buildGGUF(kvs []ggufKV, tensors []ggufT, align int) []byte {
	le := binary.LittleEndian
	b := []byte("GGUF")
	b = le.AppendUint32(b, 3)
	b = le.AppendUint64(b, uint64(len(tensors)))
	b = le.AppendUint64(b, uint64(len(kvs)))
	for _, kv := range kvs {
		b = append(b, ggufStr(kv.key)...)
		b = le.AppendUint32(b, kv.typ)
		b = append(b, kv.val...)
	}
	off := 0
	for _, t := range tensors {
		b = append(b, ggufStr(t.name)...)
		b = le.AppendUint32(b, uint32(len(t.dims)))
		for _, d := range t.dims {
			b = le.AppendUint64(b, d)
		}
		b = le.AppendUint32(b, t.typ)
		b = le.AppendUint64(b, uint64(off))
		off += (len(t.data) + align - 1) / align * align
	}
	for len(b)%align != 0 {
		b = append(b, 0)
	}
	for _, t := range tensors {
		b = append(b, t.data...)
		for len(t.data)%align != 0 {
			t.data = append(t.data, 0)
			b = append(b, 0)
		}
	}
	return b
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, f := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

// controlVector builds a llama.cpp-style control vector with direction.N = dirs[N] for each
// key N.
func controlVector(hidden int, dirs map[int][]float32) []byte {
	var ts []ggufT
	for n := 1; n < 1<<16; n++ {
		if d, ok := dirs[n]; ok {
			ts = append(ts, ggufT{"direction." + strconv.Itoa(n), []uint64{uint64(hidden)}, ggmlTypeF32, f32Bytes(d)})
		}
		if len(ts) == len(dirs) {
			break
		}
	}
	return buildGGUF([]ggufKV{
		kvString("general.architecture", "controlvector"),
		kvString("controlvector.model_hint", "llama"),
		kvI32("controlvector.layer_count", int32(len(dirs))),
	}, ts, 32)
}

// buildNpy writes an .npy 1.0 file by hand: header dict padded to 64 bytes, then data.
func buildNpy(descr string, shape string, data []byte) []byte {
	dict := "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }"
	total := 10 + len(dict) + 1
	pad := (64 - total%64) % 64
	b := []byte("\x93NUMPY\x01\x00")
	b = binary.LittleEndian.AppendUint16(b, uint16(len(dict)+pad+1))
	b = append(b, dict...)
	for range pad {
		b = append(b, ' ')
	}
	b = append(b, '\n')
	return append(b, data...)
}

// stTensor is one tensor for buildSafetensors.
type stTensor struct {
	name  string
	dtype string
	shape []int
	data  []byte
}

// buildSafetensors writes u64 header length, the JSON header, then the data, tensors laid out
// in the given order.
func buildSafetensors(ts []stTensor) []byte {
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	off := 0
	var data []byte
	for _, t := range ts {
		hdr[t.name] = map[string]any{"dtype": t.dtype, "shape": t.shape, "data_offsets": []int{off, off + len(t.data)}}
		off += len(t.data)
		data = append(data, t.data...)
	}
	j, err := json.Marshal(hdr)
	if err != nil {
		panic(err)
	}
	for len(j)%8 != 0 {
		j = append(j, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(j)))
	return append(append(b, j...), data...)
}

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func writeTemp(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

// requireBitwise checks that two vector sets are equal bit for bit.
func requireBitwise(t *testing.T, want, got []steer.Vector) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i].Hook, got[i].Hook, "vector %d", i)
		require.Equal(t, want[i].Layer, got[i].Layer, "vector %d", i)
		require.Equal(t, want[i].Scale, got[i].Scale, "vector %d", i)
		require.Len(t, got[i].Data, len(want[i].Data))
		for j := range want[i].Data {
			require.Equal(t, math.Float32bits(want[i].Data[j]), math.Float32bits(got[i].Data[j]), "vector %d (%s %d) element %d", i, want[i].Hook, want[i].Layer, j)
		}
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed+1)) }
