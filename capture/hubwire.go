package capture

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/shmsteer/shmsteer/steer"
)

// The hub's wire: messages on a capture connection (a consumer's or a worker's unix socket to
// the owner's hub, opened with a one-time ticket from the OpCaptureTicket RPC), both ways:
//
//	u32 length (of what follows), u8 type, payload (little-endian)
//
//	hello    c/w → hub  role u8 (1 consumer, 2 worker), ticket [32]
//	welcome  hub → c/w  -
//	refused  hub → c/w  message
//	ring     w → hub    - (the ring's memfd rides along, SCM_RIGHTS)
//	ring     hub → c    ring id u32 (its memfd rides along)
//	ringGone hub → c    ring id u32 (its worker left)
//	slot     c → hub    ring id u32, slot u32, pid u32 (the consumer attached that slot)
//	begin    hub → c    prompt length u32, u16 id length, request id, the consumer's spec (JSON)
//	end      hub → c    request id
//	synced   hub → c    - (after the rings that existed when it attached)
//	result   c → hub    status u8, u16 id length, request id, u32 error length, error, payload (JSON)
//
// decodeHubMsg checks every length against the bytes it has before it slices them.
const (
	msgHello    = 1
	msgWelcome  = 2
	msgRefused  = 3
	msgRing     = 4
	msgRingGone = 5
	msgSlot     = 6
	msgBegin    = 7
	msgEnd      = 8
	msgResult   = 9
	msgSynced   = 10

	roleConsumer = 1
	roleWorker   = 2

	ticketLen = 32
	// maxHubMsg bounds one message: a begin of the largest spec (steer.MaxCaptureSpec) with
	// the longest request id, or a result (its payload lists the consumer's output).
	maxHubMsg = steer.MaxCaptureSpec + 1<<17
)

// hubMsg is a decoded message; which fields are set depends on typ.
type hubMsg struct {
	typ     byte
	role    byte
	ticket  []byte
	ring    uint32
	slot    uint32
	pid     uint32
	prompt  uint32
	id      string
	spec    []byte // begin: the consumer's spec; result: the payload
	status  Status
	message string // refused: why; result: the error
}

func appendMsgHeader(dst []byte, typ byte) []byte {
	return append(binary.LittleEndian.AppendUint32(dst, 0), typ)
}

func finishMsg(b []byte, start int) []byte {
	binary.LittleEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

// encodeHubMsg appends m's encoding to dst; m's strings must fit their length fields (the
// callers check request ids, which are at most 65,535 bytes).
func encodeHubMsg(dst []byte, m hubMsg) []byte {
	start := len(dst)
	dst = appendMsgHeader(dst, m.typ)
	switch m.typ {
	case msgHello:
		dst = append(append(dst, m.role), m.ticket...)
	case msgRefused:
		dst = append(dst, m.message...)
	case msgRing, msgRingGone:
		if m.ring != 0 || m.typ == msgRingGone {
			dst = binary.LittleEndian.AppendUint32(dst, m.ring)
		}
	case msgSlot:
		dst = binary.LittleEndian.AppendUint32(dst, m.ring)
		dst = binary.LittleEndian.AppendUint32(dst, m.slot)
		dst = binary.LittleEndian.AppendUint32(dst, m.pid)
	case msgBegin:
		dst = binary.LittleEndian.AppendUint32(dst, m.prompt)
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(m.id)))
		dst = append(append(dst, m.id...), m.spec...)
	case msgEnd:
		dst = append(dst, m.id...)
	case msgResult:
		dst = append(dst, byte(m.status))
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(m.id)))
		dst = append(dst, m.id...)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m.message)))
		dst = append(append(dst, m.message...), m.spec...)
	}
	return finishMsg(dst, start)
}

// decodeHubMsg decodes the message at the start of b: n = 0 and no error when b holds only part
// of one; ErrHubProtocol for a length out of range or a payload that does not parse.
func decodeHubMsg(b []byte) (m hubMsg, n int, err error) {
	bad := func(format string, a ...any) (hubMsg, int, error) {
		return hubMsg{}, 0, fmt.Errorf("%w: %s", ErrHubProtocol, fmt.Sprintf(format, a...))
	}
	if len(b) < 4 {
		return hubMsg{}, 0, nil
	}
	l := uint64(binary.LittleEndian.Uint32(b))
	if l < 1 || l > maxHubMsg {
		return bad("message length %d not in [1, %d]", l, maxHubMsg)
	}
	if uint64(len(b)) < 4+l {
		return hubMsg{}, 0, nil
	}
	n = int(4 + l)
	m.typ = b[4]
	p := b[5:n]
	u32 := func(o int) uint32 { return binary.LittleEndian.Uint32(p[o:]) }
	switch m.typ {
	case msgHello:
		if len(p) != 1+ticketLen || (p[0] != roleConsumer && p[0] != roleWorker) {
			return bad("hello of %d bytes, role %d", len(p), firstOr(p))
		}
		m.role, m.ticket = p[0], p[1:]
	case msgWelcome, msgSynced:
		if len(p) != 0 {
			return bad("message type %d with %d bytes", m.typ, len(p))
		}
	case msgRefused:
		m.message = string(p)
	case msgRing:
		switch len(p) {
		case 0:
		case 4:
			m.ring = u32(0)
		default:
			return bad("ring message of %d bytes", len(p))
		}
	case msgRingGone:
		if len(p) != 4 {
			return bad("ring-gone message of %d bytes", len(p))
		}
		m.ring = u32(0)
	case msgSlot:
		if len(p) != 12 {
			return bad("slot message of %d bytes", len(p))
		}
		m.ring, m.slot, m.pid = u32(0), u32(4), u32(8)
	case msgBegin:
		if len(p) < 6 {
			return bad("begin message of %d bytes", len(p))
		}
		m.prompt = u32(0)
		il := int(binary.LittleEndian.Uint16(p[4:]))
		if il < 1 || 6+il > len(p) {
			return bad("begin with a %d-byte request id in %d bytes", il, len(p))
		}
		m.id, m.spec = string(p[6:6+il]), p[6+il:]
	case msgEnd:
		if len(p) < 1 || len(p) > math.MaxUint16 {
			return bad("end with a %d-byte request id", len(p))
		}
		m.id = string(p)
	case msgResult:
		if len(p) < 3 {
			return bad("result message of %d bytes", len(p))
		}
		m.status = Status(p[0])
		if m.status < StatusOK || m.status > StatusError {
			return bad("result status %d", p[0])
		}
		il := int(binary.LittleEndian.Uint16(p[1:]))
		if il < 1 || 3+il+4 > len(p) {
			return bad("result with a %d-byte request id in %d bytes", il, len(p))
		}
		m.id = string(p[3 : 3+il])
		o := 3 + il
		el := uint64(u32(o))
		o += 4
		if el > uint64(len(p)-o) {
			return bad("result with a %d-byte error in %d bytes", el, len(p)-o)
		}
		m.message, m.spec = string(p[o:o+int(el)]), p[o+int(el):]
	default:
		return bad("message type %d", m.typ)
	}
	return m, n, nil
}

func firstOr(p []byte) int {
	if len(p) == 0 {
		return -1
	}
	return int(p[0])
}
