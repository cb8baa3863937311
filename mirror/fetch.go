package mirror

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"time"
)

// fetchChunk is the most the object store is read at once, the rate limiter's burst (the
// object store's own chunk size is 128 KiB).
const fetchChunk = 256 << 10

// fetchObject reads the steering set an object reference names. What the reference declares
// is checked before anything is fetched: its size against the remote bound, then the object's
// recorded size (a link, or an object of another size, is refused unread). The object is then
// read at most FetchRate bytes a second into a buffer of the declared size, never past it
// (an object whose chunks hold more is refused), and its sha256 compared with the reference's.
func (m *Mirror) fetchObject(payload []byte) ([]byte, error) {
	ref, err := decodeObjectRef(payload)
	if err != nil {
		return nil, err
	}
	if ref.size == 0 || ref.size > uint64(m.remoteMax) {
		return nil, fmt.Errorf("%w: object %s declares %d bytes (remote bound %d)", ErrRemoteLimit, ref.name, ref.size, m.remoteMax)
	}
	ctx, cancel := context.WithTimeout(m.ctx, 4*putTimeout+m.fetchTime(ref.size))
	defer cancel()
	o, err := m.objects(ctx)
	if err != nil {
		return nil, err
	}
	info, err := o.GetInfo(ctx, ref.name)
	if err != nil {
		return nil, err
	}
	if info.Opts != nil && info.Opts.Link != nil {
		return nil, fmt.Errorf("%w: object %s is a link", ErrBadEnvelope, ref.name)
	}
	if info.Size != ref.size {
		return nil, fmt.Errorf("%w: object %s holds %d bytes, its reference declares %d", ErrRemoteLimit, ref.name, info.Size, ref.size)
	}
	r, err := o.Get(ctx, ref.name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b := make([]byte, ref.size)
	for off := 0; off < len(b); {
		n := min(fetchChunk, len(b)-off)
		if err := m.fetchLim.WaitN(ctx, n); err != nil {
			return nil, fmt.Errorf("shmsteer: mirror: fetch object %s: %w", ref.name, err)
		}
		if _, err := io.ReadFull(r, b[off:off+n]); err != nil {
			return nil, fmt.Errorf("%w: object %s: %w", ErrBadEnvelope, ref.name, err)
		}
		off += n
	}
	var extra [1]byte
	if n, _ := r.Read(extra[:]); n > 0 {
		return nil, fmt.Errorf("%w: object %s holds more than the %d bytes it declares", ErrRemoteLimit, ref.name, ref.size)
	}
	if sha256.Sum256(b) != ref.sum {
		return nil, fmt.Errorf("%w: object %s does not match its reference's digest", ErrBadEnvelope, ref.name)
	}
	return b, nil
}

// fetchTime is how long reading n bytes takes at FetchRate.
func (m *Mirror) fetchTime(n uint64) time.Duration {
	return time.Duration(float64(n) / float64(m.fetchLim.Limit()) * float64(time.Second))
}
