package ipc

import (
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shmsteer/shmsteer/internal/proto"
)

// Wire format. Every message on an attach socket, in the handshake and after it, is a frame:
//
//	u32 length   bytes that follow this field (op, id and payload), little-endian
//	u16 op
//	u32 id       request id; a reply carries its request's id; 0 in the handshake
//	payload      length-6 bytes
//
// decodeFrame validates the length against a maximum before anything is allocated for the
// payload, and the payload decoders below never trust a length they have not checked, so a
// hostile or corrupt peer gets an error, never a panic or a large allocation.
const (
	frameHeader = 10
	// protoVersion is the attach and RPC protocol version, carried by the handshake frames.
	protoVersion = 3

	// DefaultMaxFrameBytes is the default bound on one RPC frame (request or reply), header
	// included: room for a full set of steering vectors (4096 floats × dozens of layers).
	DefaultMaxFrameBytes = 64 << 20
	// MaxFrameBytesLimit is the largest OwnerOptions.MaxFrameBytes accepted.
	MaxFrameBytesLimit = 1 << 30
	// minFrameBytes is the smallest MaxFrameBytes accepted: room for the requests of every
	// room (a key set of the default 4 KiB key, a steering vector).
	minFrameBytes = 64 << 10
	// handshakeMaxFrame bounds frames before the peer is authenticated.
	handshakeMaxFrame = 512

	nonceLen = 32
	macLen   = 32
)

// Ops. Ops below MinUserOp belong to this package; Owner.Handle takes ops from MinUserOp up to
// MaxUserOp.
const (
	opHello     = proto.OpHello
	opChallenge = proto.OpChallenge
	opProof     = proto.OpProof
	opWelcome   = proto.OpWelcome
	opError     = proto.OpError

	opBye  = proto.OpBye
	opPing = proto.OpPing

	opReplyOK  = proto.OpReplyOK
	opReplyErr = proto.OpReplyErr

	// MinUserOp is the first op Owner.Handle accepts; ops below it are reserved for ipc.
	MinUserOp = proto.MinUserOp
	// MaxUserOp is the last op Owner.Handle accepts; ops above it are replies.
	MaxUserOp = proto.MaxUserOp
)

type frame struct {
	op      uint16
	id      uint32
	payload []byte
}

// decodeFrame decodes the frame at the start of b. It returns n = 0 and no error when b holds
// only part of a frame (read more); an error when the length field is out of range, that is
// below the header or above max bytes for the whole frame. The payload aliases b.
func decodeFrame(b []byte, max int) (f frame, n int, err error) {
	if len(b) < 4 {
		return frame{}, 0, nil
	}
	l := uint64(binary.LittleEndian.Uint32(b))
	if l < frameHeader-4 {
		return frame{}, 0, fmt.Errorf("%w: frame length %d below the header", ErrProtocol, l)
	}
	if max < frameHeader || l+4 > uint64(max) {
		return frame{}, 0, fmt.Errorf("%w: frame of %d bytes, at most %d", ErrFrameTooLarge, l+4, max)
	}
	total := int(l) + 4
	if len(b) < total {
		return frame{}, 0, nil
	}
	return frame{
		op:      binary.LittleEndian.Uint16(b[4:]),
		id:      binary.LittleEndian.Uint32(b[6:]),
		payload: b[frameHeader:total:total],
	}, total, nil
}

// frameNeed returns the total size of the frame starting at b once its length field is in,
// or 0 if it is not yet.
func frameNeed(b []byte) int {
	if len(b) < 4 {
		return 0
	}
	return int(binary.LittleEndian.Uint32(b)) + 4
}

// beginFrame appends a frame header with a zero length to dst; finishFrame fills the length
// once the payload is appended.
func beginFrame(dst []byte, op uint16, id uint32) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint16(dst, op)
	return binary.LittleEndian.AppendUint32(dst, id)
}

func finishFrame(b []byte, start int) {
	binary.LittleEndian.PutUint32(b[start:], uint32(len(b)-start-4))
}

func appendFrame(dst []byte, op uint16, id uint32, payload []byte) []byte {
	start := len(dst)
	dst = append(beginFrame(dst, op, id), payload...)
	finishFrame(dst, start)
	return dst
}

// hello: u8 version, client nonce.
func encodeHello(nonce []byte) []byte {
	return append([]byte{protoVersion}, nonce...)
}

// decodeVersion checks the version byte every handshake payload starts with; the version
// is checked before the length, so a newer peer with a longer payload is told apart from a
// malformed one.
func decodeVersion(p []byte) error {
	if len(p) < 1 {
		return fmt.Errorf("%w: empty handshake payload", ErrProtocol)
	}
	if p[0] != protoVersion {
		return fmt.Errorf("%w: peer speaks protocol %d, this build %d", ErrIncompatible, p[0], protoVersion)
	}
	return nil
}

func decodeHello(p []byte) (nonce []byte, err error) {
	if err := decodeVersion(p); err != nil {
		return nil, err
	}
	if len(p) != 1+nonceLen {
		return nil, fmt.Errorf("%w: hello of %d bytes", ErrProtocol, len(p))
	}
	return p[1:], nil
}

// challenge: u8 version, owner nonce, owner proof.
func encodeChallenge(nonce []byte, proof [macLen]byte) []byte {
	b := append([]byte{protoVersion}, nonce...)
	return append(b, proof[:]...)
}

func decodeChallenge(p []byte) (nonce, proof []byte, err error) {
	if err := decodeVersion(p); err != nil {
		return nil, nil, err
	}
	if len(p) != 1+nonceLen+macLen {
		return nil, nil, fmt.Errorf("%w: challenge of %d bytes", ErrProtocol, len(p))
	}
	return p[1 : 1+nonceLen], p[1+nonceLen:], nil
}

func decodeProof(p []byte) ([]byte, error) {
	if len(p) != macLen {
		return nil, fmt.Errorf("%w: proof of %d bytes", ErrProtocol, len(p))
	}
	return p, nil
}

// welcome: u8 version, u64 region id, u32 owner pid, u32 max frame bytes.
type welcome struct {
	regionID uint64
	ownerPID uint32
	maxFrame uint32
}

const welcomeLen = 1 + 8 + 4 + 4

func (w welcome) encode() []byte {
	b := []byte{protoVersion}
	b = binary.LittleEndian.AppendUint64(b, w.regionID)
	b = binary.LittleEndian.AppendUint32(b, w.ownerPID)
	return binary.LittleEndian.AppendUint32(b, w.maxFrame)
}

func decodeWelcome(p []byte) (welcome, error) {
	if err := decodeVersion(p); err != nil {
		return welcome{}, err
	}
	if len(p) != welcomeLen {
		return welcome{}, fmt.Errorf("%w: welcome of %d bytes", ErrProtocol, len(p))
	}
	w := welcome{
		regionID: binary.LittleEndian.Uint64(p[1:]),
		ownerPID: binary.LittleEndian.Uint32(p[9:]),
		maxFrame: binary.LittleEndian.Uint32(p[13:]),
	}
	if w.maxFrame < minFrameBytes || w.maxFrame > MaxFrameBytesLimit {
		return welcome{}, fmt.Errorf("%w: welcome frame limit %d out of range", ErrProtocol, w.maxFrame)
	}
	return w, nil
}

// Error payload (opError and opReplyErr): u16 code, message.
func appendError(dst []byte, code uint16, msg string) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, code)
	return append(dst, msg...)
}

func decodeError(p []byte) (code uint16, msg string, err error) {
	if len(p) < 2 {
		return 0, "", fmt.Errorf("%w: error payload of %d bytes", ErrProtocol, len(p))
	}
	return binary.LittleEndian.Uint16(p), string(p[2:]), nil
}

// frameReader accumulates bytes from a stream and cuts frames out of them. Bytes read past
// a frame stay for the next call, so a read that timed out midway loses nothing. Consumed
// bytes are zeroed (frames may carry keys).
//
// Memory: the buffer starts at readerInitial bytes and grows by doubling on the Go heap up to
// readerKeep; a frame larger than that gets an anonymous mapping of exactly its size, whose
// pages the kernel commits only as bytes arrive. Once the frame is consumed (release), the
// mapping's pages are discarded (madvise MADV_DONTNEED), so its memory goes back to the kernel
// at once instead of lingering in the Go heap, and the mapping is kept as a spare for the
// connection's next large frame: a stale view of the consumed frame reads zeros, as for a
// heap buffer, never memory mapped since. The spare is unmapped by wipe, when the connection
// ends. A heap buffer grown past readerRetain is zeroed and dropped. Everything beyond readerRetain is charged to
// budget, if set (the owner's MaxBufferedBytes, shared by all its connections), waiting at
// most budgetWait for room.
type frameReader struct {
	buf                []byte
	start, end         int    // unparsed bytes
	prevStart, prevEnd int    // the frame returned last; zeroed on the next call
	mapped             bool   // buf is an anonymous mapping: discard it into spare, never drop it
	spare              []byte // a discarded mapping (no memory committed), for the next large frame
	charged            int    // bytes of buf charged to budget

	budget     *byteBudget   // nil: no shared bound (clients)
	budgetWait time.Duration // how long to wait for room in budget
	done       <-chan struct{}
}

const (
	readerInitial = 4 << 10
	readerRetain  = 64 << 10 // a buffer up to this size is kept between frames, uncharged
	readerKeep    = 1 << 20  // a heap buffer grows to at most this; larger frames are mapped
)

// next returns the next frame, reading with read as needed; the payload is valid until the
// next call (or release).
func (r *frameReader) next(read func([]byte) (int, error), max int) (frame, error) {
	r.release()
	for {
		f, n, err := decodeFrame(r.buf[r.start:r.end], max)
		if err != nil {
			return frame{}, err
		}
		if n > 0 {
			r.prevStart, r.prevEnd = r.start, r.start+n
			r.start += n
			return f, nil
		}
		if err := r.makeRoom(frameNeed(r.buf[r.start:r.end])); err != nil {
			return frame{}, err
		}
		m, err := read(r.buf[r.end:])
		if m < 0 || m > len(r.buf)-r.end {
			// recvmsg reports a reset as n = -1 (net.UnixConn.ReadMsgUnix passes it on): a
			// count outside the buffer is no bytes, never an offset.
			m = 0
			if err == nil {
				err = fmt.Errorf("%w: read returned an impossible byte count", ErrProtocol)
			}
		}
		r.end += m
		if err != nil && m == 0 {
			return frame{}, err
		}
	}
}

// release zeroes the frame returned last and, if nothing else is buffered, gives back a
// large buffer (unmapping a mapped one). Callers call it once done with a frame, so memory
// does not wait for the next frame; the payload is invalid afterwards.
func (r *frameReader) release() {
	if r.prevEnd > r.prevStart {
		if !r.mapped {
			clear(r.buf[r.prevStart:r.prevEnd])
		}
		r.prevStart, r.prevEnd = 0, 0
	}
	if r.start == r.end && (r.mapped || cap(r.buf) > readerRetain) {
		r.free()
	}
}

// buffered is how many bytes of an incomplete frame are held.
func (r *frameReader) buffered() int { return r.end - r.start }

// pendingID is the request id of the incomplete frame, once its header is in.
func (r *frameReader) pendingID() (uint32, bool) {
	if r.end-r.start < frameHeader {
		return 0, false
	}
	return binary.LittleEndian.Uint32(r.buf[r.start+6:]), true
}

// free drops the buffer, zeroed (heap) or discarded into spare (mapped), and returns its
// charge.
func (r *frameReader) free() {
	if r.mapped {
		r.discard(r.buf)
	} else {
		clear(r.buf)
	}
	r.buf, r.mapped = nil, false
	r.start, r.end, r.prevStart, r.prevEnd = 0, 0, 0, 0
	if r.charged > 0 {
		r.budget.release(r.charged)
		r.charged = 0
	}
}

// makeRoom compacts the buffer and grows it so that at least one more byte, and if known the
// whole pending frame, fits. Heap growth is at most doubling, so memory follows the bytes
// that actually arrive rather than a length field; a mapping's pages, too, are committed only
// as bytes arrive. The charge to the budget is for the buffer's full size, so the bound holds
// whatever the peer sends.
func (r *frameReader) makeRoom(need int) error {
	pending := r.end - r.start
	if pending == 0 && (r.mapped || cap(r.buf) > readerRetain) {
		r.free()
	}
	if r.buf == nil {
		r.buf = make([]byte, readerInitial)
	}
	if r.start > 0 {
		copy(r.buf, r.buf[r.start:r.end])
		clear(r.buf[pending:r.end])
		r.start, r.end = 0, pending
	}
	if r.end < len(r.buf) {
		return nil
	}
	size := max(min(max(need, r.end+1), 2*len(r.buf)), len(r.buf)+1)
	mapIt := need > readerKeep
	if mapIt {
		size = need
	}
	if r.budget != nil {
		if want := max(size-readerRetain, 0) - r.charged; want > 0 {
			if err := r.budget.acquire(want, r.budgetWait, r.done); err != nil {
				return err
			}
			r.charged += want
		}
	}
	var nb []byte
	switch {
	case mapIt && cap(r.spare) >= size:
		nb, r.spare = r.spare[:size], nil // cap kept: Munmap finds the mapping by it
	case mapIt:
		if r.spare != nil {
			unix.Munmap(r.spare)
			r.spare = nil
		}
		b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("%w: mapping a %d-byte frame buffer: %w", ErrBusy, size, err)
		}
		nb = b
	default:
		nb = make([]byte, size)
	}
	copy(nb, r.buf[:r.end])
	if r.mapped {
		r.discard(r.buf)
	} else {
		clear(r.buf)
	}
	r.buf, r.mapped = nb, mapIt
	return nil
}

// discard gives a mapping's pages back to the kernel (they read as zeros from now on) and
// keeps the mapping as the spare, unmapping the smaller of it and an existing spare.
func (r *frameReader) discard(m []byte) {
	unix.Madvise(m[:cap(m)], unix.MADV_DONTNEED)
	switch {
	case r.spare == nil:
		r.spare = m
	case cap(m) > cap(r.spare):
		unix.Munmap(r.spare)
		r.spare = m
	default:
		unix.Munmap(m)
	}
}

// wipe zeroes everything buffered and frees the buffer and the spare mapping; nothing read
// from this reader may be used afterwards.
func (r *frameReader) wipe() {
	if r.buf != nil {
		r.free()
	}
	if r.spare != nil {
		unix.Munmap(r.spare)
		r.spare = nil
	}
}
