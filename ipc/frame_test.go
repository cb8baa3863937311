package ipc

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		op      uint16
		id      uint32
		payload []byte
	}{
		{"empty", opPing, 1, nil},
		{"bye", opBye, 7, nil},
		{"user op", 300, 0xffffffff, bytes.Repeat([]byte{0xab}, 70000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := appendFrame(nil, tt.op, tt.id, tt.payload)
			for cut := range min(len(b), 64) {
				_, n, err := decodeFrame(b[:cut], DefaultMaxFrameBytes)
				require.NoError(t, err)
				require.Zero(t, n, "a partial frame is incomplete, not an error")
			}
			f, n, err := decodeFrame(append(b, 0xff), DefaultMaxFrameBytes)
			require.NoError(t, err)
			require.Equal(t, len(b), n)
			require.Equal(t, tt.op, f.op)
			require.Equal(t, tt.id, f.id)
			require.Equal(t, len(tt.payload), len(f.payload))
			require.True(t, bytes.Equal(tt.payload, f.payload))
		})
	}
}

func TestDecodeFrameLimits(t *testing.T) {
	hdr := func(l uint32) []byte { return binary.LittleEndian.AppendUint32(nil, l) }
	_, _, err := decodeFrame(hdr(5), 1<<20)
	require.ErrorIs(t, err, ErrProtocol)
	_, _, err = decodeFrame(hdr(0xffffffff), DefaultMaxFrameBytes)
	require.ErrorIs(t, err, ErrFrameTooLarge, "rejected from the length field alone")
	_, _, err = decodeFrame(hdr(1<<20-4+1), 1<<20)
	require.ErrorIs(t, err, ErrFrameTooLarge)
	_, n, err := decodeFrame(hdr(1<<20-4), 1<<20)
	require.NoError(t, err)
	require.Zero(t, n)
}

// trickle is a reader that hands out at most k bytes per call.
type trickle struct {
	b []byte
	k int
}

func (r *trickle) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.k)], r.b)
	r.b = r.b[n:]
	return n, nil
}

func TestFrameReader(t *testing.T) {
	var stream []byte
	sizes := []int{0, 1, 100, 5000, 3 << 20, 10}
	for i, s := range sizes {
		stream = appendFrame(stream, 300, uint32(i), bytes.Repeat([]byte{byte(i + 1)}, s))
	}
	for _, k := range []int{1, 7, 4096, 1 << 22} {
		src := &trickle{b: stream, k: k}
		if k == 1 {
			src.b = stream[:3*1024] // byte at a time is slow; the first frames suffice
		}
		var fr frameReader
		defer fr.wipe()
		for i, s := range sizes {
			f, err := fr.next(src.Read, DefaultMaxFrameBytes)
			if err == io.EOF && k == 1 {
				break
			}
			require.NoError(t, err, "k=%d frame %d", k, i)
			require.Equal(t, uint32(i), f.id)
			require.Equal(t, s, len(f.payload))
			require.Equal(t, bytes.Repeat([]byte{byte(i + 1)}, s), f.payload)
			if s > readerKeep {
				payload := f.payload
				_, err := fr.next(src.Read, DefaultMaxFrameBytes)
				require.NoError(t, err)
				require.Equal(t, make([]byte, len(payload)), payload, "a consumed frame is zeroed")
				break
			}
		}
	}
}

func TestPayloadDecoders(t *testing.T) {
	w := welcome{regionID: 42, ownerPID: 7, maxFrame: 1 << 20}
	got, err := decodeWelcome(w.encode())
	require.NoError(t, err)
	require.Equal(t, w, got)
	bad := w.encode()
	bad[0] = 9
	_, err = decodeWelcome(bad)
	require.ErrorIs(t, err, ErrIncompatible)

	code, msg, err := decodeError(appendError(nil, codeUnknownOp, "m"))
	require.NoError(t, err)
	require.Equal(t, codeUnknownOp, code)
	require.Equal(t, "m", msg)
	require.ErrorIs(t, remoteError(code, msg), ErrUnknownOp)
}

// FuzzDecodeFrame feeds arbitrary bytes to the frame decoder and to the payload decoder its op
// selects: nothing may panic, a decoded frame must re-encode to the bytes it came from, and
// the stateful reader must agree with the pure decoder.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(appendFrame(nil, opHello, 0, encodeHello(make([]byte, nonceLen))), 512)
	f.Add(appendFrame(nil, opChallenge, 0, encodeChallenge(make([]byte, nonceLen), [macLen]byte{})), 512)
	f.Add(appendFrame(nil, opProof, 0, make([]byte, macLen)), 512)
	f.Add(appendFrame(nil, opWelcome, 0, welcome{1, 2, 1 << 20}.encode()), 1<<20)
	f.Add(appendFrame(nil, storeSet, 3, []byte{3, 0, 'r', 'e', 'q', 'k'}), 1<<20)
	f.Add(appendFrame(nil, opReplyErr, 5, appendError(nil, 4000, "msg")), 1<<20)
	f.Add(appendFrame(appendFrame(nil, opPing, 1, nil), opBye, 2, nil), 64)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 0}, 1<<20)
	f.Add([]byte{5, 0, 0, 0, 1, 0, 0, 0, 0, 0}, 64)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, b []byte, max int) {
		fr, n, err := decodeFrame(b, max)
		if err != nil || n == 0 {
			return
		}
		if n > len(b) || n < frameHeader || (max >= 0 && n > max) {
			t.Fatalf("decoded %d bytes of %d (max %d)", n, len(b), max)
		}
		if re := appendFrame(nil, fr.op, fr.id, fr.payload); !bytes.Equal(re, b[:n]) {
			t.Fatalf("re-encoding differs")
		}
		switch fr.op {
		case opHello:
			decodeHello(fr.payload)
		case opChallenge:
			decodeChallenge(fr.payload)
		case opProof:
			decodeProof(fr.payload)
		case opWelcome:
			decodeWelcome(fr.payload)
		case opError, opReplyErr:
			if code, msg, err := decodeError(fr.payload); err == nil {
				_ = remoteError(code, msg).Error()
			}
		}
		var r frameReader
		src := &trickle{b: b, k: 3}
		f2, err := r.next(src.Read, max)
		if err != nil || f2.op != fr.op || f2.id != fr.id || !bytes.Equal(f2.payload, fr.payload) {
			t.Fatalf("frameReader disagrees: %v", err)
		}
	})
}

func TestByteBudget(t *testing.T) {
	b := newByteBudget(10)
	require.NoError(t, b.acquire(6, time.Second, nil))
	require.ErrorIs(t, b.acquire(5, 20*time.Millisecond, nil), ErrBusy, "no room in time")
	require.ErrorIs(t, b.acquire(11, time.Second, nil), ErrBusy, "never fits")
	done := make(chan struct{})
	close(done)
	require.ErrorIs(t, b.acquire(5, time.Second, done), ErrClosed)
	got := make(chan error, 1)
	go func() { got <- b.acquire(5, 5*time.Second, nil) }()
	time.Sleep(20 * time.Millisecond)
	b.release(6)
	require.NoError(t, <-got, "a release lets a waiter in")
	require.Equal(t, 5, b.inUse())
}
