package serve

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/mirror"
)

// recordingKeys is a keyWriter that records the writes it gets.
type recordingKeys struct {
	writes []string
	err    error
}

func (r *recordingKeys) Set(id string, key []byte) error {
	r.writes = append(r.writes, fmt.Sprintf("set %s %x", id, key))
	return r.err
}

func (r *recordingKeys) Remove(id string) error {
	r.writes = append(r.writes, "rm "+id)
	return r.err
}

// TestKeyRPCs: serve's key ops decode their request strictly (a malformed one writes nothing)
// and write through the key writer (the mirror's Keys with --mirror-keys); a full mirror queue
// leaves the local write standing and is not an error.
func TestKeyRPCs(t *testing.T) {
	set := func(id string, key []byte) []byte {
		return append(append(binary.LittleEndian.AppendUint16(nil, uint16(len(id))), id...), key...)
	}
	for name, tc := range map[string]struct {
		op      func(*Server, []byte) ([]byte, error)
		req     []byte
		werr    error
		wantErr error
		writes  []string
	}{
		"set":          {op: (*Server).handleKeySet, req: set("req-1", []byte{1, 2}), writes: []string{"set req-1 0102"}},
		"set no key":   {op: (*Server).handleKeySet, req: set("req-1", nil), writes: []string{"set req-1 "}},
		"set short":    {op: (*Server).handleKeySet, req: []byte{5}, wantErr: ErrBadInput},
		"set empty id": {op: (*Server).handleKeySet, req: set("", []byte{1}), wantErr: ErrBadInput},
		"set id past end": {op: (*Server).handleKeySet, req: append(binary.LittleEndian.AppendUint16(nil, 9), "abc"...),
			wantErr: ErrBadInput},
		"remove":       {op: (*Server).handleKeyRemove, req: []byte("req-1"), writes: []string{"rm req-1"}},
		"remove empty": {op: (*Server).handleKeyRemove, req: nil, wantErr: ErrBadInput},
		"queue full":   {op: (*Server).handleKeyRemove, req: []byte("r"), werr: fmt.Errorf("x: %w", mirror.ErrQueueFull), writes: []string{"rm r"}},
		"write error": {op: (*Server).handleKeySet, req: set("r", []byte{1}), werr: ErrBadInput, wantErr: ErrBadInput,
			writes: []string{"set r 01"}},
	} {
		rk := &recordingKeys{err: tc.werr}
		s := &Server{keyw: rk, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		_, err := tc.op(s, tc.req)
		if tc.wantErr != nil {
			require.ErrorIs(t, err, tc.wantErr, name)
		} else {
			require.NoError(t, err, name)
		}
		require.Equal(t, tc.writes, rk.writes, name)
	}
}

// FuzzKeySetRequest: any request bytes either decode to one write of the id and key they hold
// or are refused with ErrBadInput and write nothing; never a panic.
func FuzzKeySetRequest(f *testing.F) {
	f.Add([]byte{5, 0, 'r', 'e', 'q', '-', '1', 1, 2, 3})
	f.Add([]byte{0, 0})
	f.Add([]byte{0xff, 0xff, 'a'})
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, req []byte) {
		rk := &recordingKeys{}
		s := &Server{keyw: rk, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		_, err := s.handleKeySet(req)
		if err != nil {
			require.ErrorIs(t, err, ErrBadInput)
			require.Empty(t, rk.writes)
			return
		}
		n := int(binary.LittleEndian.Uint16(req))
		require.Equal(t, []string{fmt.Sprintf("set %s %x", req[2:2+n], req[2+n:])}, rk.writes)
	})
}
