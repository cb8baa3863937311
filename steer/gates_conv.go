package steer

import (
	"hash/fnv"

	"github.com/shmsteer/shmsteer/shm"
)

// rest_of_conversation: the owner keeps each conversation's rest_of_conversation gates (those
// of its latest request that had any) and carries them onto the conversation's later requests
// that bring none of their own, re-resolved at that admission: a gate whose named probe or
// steering vector changed (another digest) or is gone is dropped, as latches drop a reference
// whose digest changed. Steppers remember, per conversation and gate (keyed by the probe's
// and the add's digests), that it engaged, so a carried gate applies from the new request's
// first decode step; every rank decides that from the same steps. The owner's table is in
// memory (not persisted) and bounded (maxGateConvs, oldest first out).

const maxGateConvs = 1024

// gateConvs is the owner's table, guarded by Engine.mu.
type gateConvs struct {
	m     map[ConvKey]gateConv
	order []ConvKey
}

type gateConv struct {
	gates   []Gate
	digests [][2]Digest // per gate: the probe's and the add's digest when latched
}

func convHash(k ConvKey) uint64 {
	if k.zero() {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(k.Tenant))
	h.Write([]byte{0})
	h.Write([]byte(k.ID))
	return h.Sum64() | 1
}

// admitGates resolves an admission's gates plus, for a conversation, the rest_of_conversation
// gates it carries, and encodes them. It changes the owner's table only after they resolved.
func (e *Engine) admitGates(s *shm.Snapshot, a *Admission, set string) ([]byte, error) {
	res, err := e.resolveGates(s, a.Gates, set)
	if err != nil || a.Conversation.zero() {
		return encodeGates(res, e.cfg.Hidden, 0), err
	}
	var own []int
	for i := range a.Gates {
		if a.Gates[i].Scope == ScopeRestOfConversation {
			own = append(own, i)
		}
	}
	t := &e.gateConv
	if len(own) > 0 {
		c := gateConv{}
		for _, i := range own {
			g := a.Gates[i]
			g.When.Probe.Vectors = cloneVectors(g.When.Probe.Vectors)
			g.Apply.Steer.Vectors = cloneVectors(g.Apply.Steer.Vectors)
			c.gates = append(c.gates, g)
			c.digests = append(c.digests, [2]Digest{res[i].probeDigest, res[i].steerDig})
		}
		if t.m == nil {
			t.m = map[ConvKey]gateConv{}
		}
		if _, ok := t.m[a.Conversation]; !ok {
			t.order = append(t.order, a.Conversation)
			if len(t.order) > maxGateConvs {
				delete(t.m, t.order[0])
				t.order = t.order[1:]
			}
		}
		t.m[a.Conversation] = c
	} else if c, ok := t.m[a.Conversation]; ok && len(res)+len(c.gates) <= MaxGates {
		for i := range c.gates {
			r, err := e.resolveGates(s, c.gates[i:i+1], set)
			if err != nil || r[0].probeDigest != c.digests[i][0] || r[0].steerDig != c.digests[i][1] {
				continue // changed or gone: dropped
			}
			res = append(res, r[0])
		}
	}
	return encodeGates(res, e.cfg.Hidden, convHash(a.Conversation)), nil
}

func cloneVectors(vs []Vector) []Vector {
	if vs == nil {
		return nil
	}
	out := make([]Vector, len(vs))
	for i, v := range vs {
		v.Data = append([]float32(nil), v.Data...)
		out[i] = v
	}
	return out
}
