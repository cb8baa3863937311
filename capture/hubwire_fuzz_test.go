package capture

import (
	"reflect"
	"testing"
)

// The hub's messages come from other processes: any bytes decode to a message or an error,
// never a panic or a slice past the input, and a decoded message encodes to bytes that decode
// to the same message.
func FuzzHubMsg(f *testing.F) {
	for _, m := range []hubMsg{
		{typ: msgHello, role: roleConsumer, ticket: make([]byte, ticketLen)},
		{typ: msgWelcome}, {typ: msgSynced}, {typ: msgRefused, message: "no"},
		{typ: msgRing}, {typ: msgRing, ring: 3}, {typ: msgRingGone, ring: 3},
		{typ: msgSlot, ring: 1, slot: 2, pid: 3},
		{typ: msgBegin, prompt: 9, id: "req", spec: []byte(`{"tag":"t"}`)},
		{typ: msgEnd, id: "req"},
		{typ: msgResult, status: StatusPartialError, id: "req", message: "dropped", spec: []byte(`["/a"]`)},
	} {
		f.Add(encodeHubMsg(nil, m))
	}
	f.Add([]byte{1, 0, 0, 0, 99})
	f.Add([]byte{255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := decodeHubMsg(b)
		if err != nil || n == 0 {
			return
		}
		if n > len(b) {
			t.Fatalf("consumed %d of %d bytes", n, len(b))
		}
		m = cloneMsg(m)
		again, n2, err := decodeHubMsg(encodeHubMsg(nil, m))
		if err != nil || n2 == 0 {
			t.Fatalf("re-encoding %+v: %v", m, err)
		}
		again = cloneMsg(again)
		if len(m.spec) == 0 {
			m.spec = nil
		}
		if len(again.spec) == 0 {
			again.spec = nil
		}
		if !reflect.DeepEqual(m, again) {
			t.Fatalf("round trip %+v != %+v", m, again)
		}
	})
}
