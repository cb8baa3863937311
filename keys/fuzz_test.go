package keys

import (
	"bytes"
	"errors"
	"testing"

	"github.com/shmsteer/shmsteer/ipc"
)

// FuzzDecodeSet feeds arbitrary bytes to the owner's decoder of a worker's key set: nothing may
// panic, a payload it accepts re-encodes to the same bytes, and one it refuses is ErrProtocol.
func FuzzDecodeSet(f *testing.F) {
	f.Add(appendSet(nil, "req-1", []byte("key")))
	f.Add(appendSet(nil, "", nil))
	f.Add([]byte{5, 0, 'a'})
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		id, key, err := decodeSet(p)
		if err != nil {
			if !errors.Is(err, ipc.ErrProtocol) {
				t.Fatalf("refusal %v is not ErrProtocol", err)
			}
			return
		}
		if re := appendSet(nil, string(id), key); !bytes.Equal(re, p) {
			t.Fatalf("re-encoding differs")
		}
	})
}
