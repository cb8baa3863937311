package steer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"strings"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// rest_of_conversation: the owner keeps each conversation's rest_of_conversation gates (those
// of its latest request that had any) and carries them onto the conversation's later requests
// that bring none of their own, re-resolved at that admission: a gate whose named probe or
// steering vector changed (another digest) or is gone is dropped, as latches drop a reference
// whose digest changed.
//
// Engaged state: a Stepper that sees such a gate engage remembers it (per conversation and
// gate, keyed by the probe's and the add's digests) and reports it to the owner
// (OpGateEngaged, from a goroutine: never on the step's path), which marks the gate engaged in
// its table. A later admission of the conversation stores the gate with its engaged flag, so
// it applies from the request's first decode step on every Stepper, also one that never saw it
// engage (a restarted worker, another host's). Every rank decides the same from the same steps
// and the same flag.
//
// The table is bounded like the latch map, by the same caps (LatchConfig.MaxConversations,
// default 1024, and MaxPerTenant: a tenant at its cap evicts its own oldest first), oldest
// first out. It is exported and restored whole (GateConversations, RestoreGateConversation:
// serve's state dir) and entry by entry (GateConversation: the mirror), in the SGCV encoding:
//
//	"SGCV" | u8 format version (1) | u8 gates | u16 tenant length | u16 id length | u16 0 |
//	tenant | id | per gate:
//	  u8 when | u8 scope | u8 apply | u8 flags (bit 0: engaged) | f32 threshold |
//	  f32 sharpness | f32 strength | probe source | steer source
//	source: u8 0 (none) | u8 1, u16 name length, name, [32]byte digest (a registered vector,
//	        as resolved when latched) | u8 2, u32 length, steering wire encoding (inline)
//
// Every length is checked on decode (FuzzDecodeGateConversation). Changes reach observers as
// ChangeConversation (Change.Name: GateConversationName), evictions as its deletions.

// ChangeConversation is a Change of a conversation's rest_of_conversation gates (Change.Name is
// GateConversationName of its ConvKey): latched, engaged, replaced, evicted (Deleted).
const ChangeConversation ChangeKind = 4

// OpGateEngaged (internal/proto) carries a worker's engaged rest_of_conversation gates to the
// owner: u64 gate keys.
const OpGateEngaged uint16 = proto.OpGateEngaged

const (
	gconvMagic   = "SGCV"
	gconvVersion = 1
	gconvHdr     = 12
	// maxTenantLen bounds a conversation's tenant in the SGCV encoding.
	maxTenantLen = 256
)

// gateConvs is the owner's table, guarded by Owner.mu.
type gateConvs struct {
	m     map[ConvKey]*gateConv
	order []ConvKey          // oldest first
	byKey map[uint64]ConvKey // a gate's key (gateConvKey) → its conversation
	use   map[string]int     // conversations per non-empty tenant
}

type gateConv struct {
	gates   []Gate
	digests [][2]Digest // per gate: the probe's and the add's digest when latched
	keys    []uint64    // per gate: gateConvKey
	engaged []bool      // per gate: a Stepper reported it engaged
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

// gateConvKey names a rest_of_conversation gate within conversation conv (convHash): Steppers
// key their engaged memory by it and report it to the owner.
func gateConvKey(conv uint64, probe, steer Digest, when WhenKind, apply ApplyKind) uint64 {
	return mix64(mix64(mix64(conv, digest64(probe)), digest64(steer)), uint64(when)<<8|uint64(apply)) | 1
}

// GateConversationName is the Change.Name of conversation k's gates: tenant, NUL, id.
func GateConversationName(k ConvKey) string { return k.Tenant + "\x00" + k.ID }

// ParseGateConversationName inverts GateConversationName.
func ParseGateConversationName(s string) (ConvKey, bool) {
	t, id, ok := strings.Cut(s, "\x00")
	return ConvKey{Tenant: t, ID: id}, ok && id != ""
}

// admitGates resolves an admission's gates plus, for a conversation, the rest_of_conversation
// gates it carries, and encodes them. It changes nothing: commit records the admission's own
// rest_of_conversation gates in the owner's table (call it once the admission is decided).
func (e *Owner) admitGates(s *shm.Snapshot, a *Admission, set string) (enc []byte, commit func(), err error) {
	commit = func() {}
	res, err := e.resolveGates(s, a.Gates, set)
	if err != nil {
		return nil, commit, err
	}
	if a.Conversation.zero() {
		return encodeGates(res, e.cfg.Hidden, 0), commit, nil
	}
	conv := convHash(a.Conversation)
	var own []int
	for i := range a.Gates {
		if a.Gates[i].Scope == ScopeRestOfConversation {
			own = append(own, i)
		}
	}
	t := &e.gateConv
	if len(own) > 0 {
		old := t.m[a.Conversation]
		c := &gateConv{}
		for _, i := range own {
			g := a.Gates[i]
			g.When.Probe.Vectors = cloneVectors(g.When.Probe.Vectors)
			g.Apply.Steer.Vectors = cloneVectors(g.Apply.Steer.Vectors)
			key := gateConvKey(conv, res[i].probeDigest, res[i].steerDig, g.When.Kind, g.Apply.Kind)
			res[i].engaged = old.isEngaged(key) // the same gate again keeps its state
			c.gates = append(c.gates, g)
			c.digests = append(c.digests, [2]Digest{res[i].probeDigest, res[i].steerDig})
			c.keys = append(c.keys, key)
			c.engaged = append(c.engaged, res[i].engaged)
		}
		commit = func() { e.putGateConv(a.Conversation, c, "") }
	} else if c, ok := t.m[a.Conversation]; ok && len(res)+len(c.gates) <= MaxGates {
		for i := range c.gates {
			r, err := e.resolveGates(s, c.gates[i:i+1], set)
			if err != nil || r[0].probeDigest != c.digests[i][0] || r[0].steerDig != c.digests[i][1] {
				continue // changed or gone: dropped
			}
			r[0].engaged = c.engaged[i]
			res = append(res, r[0])
		}
	}
	return encodeGates(res, e.cfg.Hidden, conv), commit, nil
}

func (c *gateConv) isEngaged(key uint64) bool {
	if c == nil {
		return false
	}
	for j, k := range c.keys {
		if k == key {
			return c.engaged[j]
		}
	}
	return false
}

// putGateConv stores c as conversation k's entry (the newest) and evicts to the caps, under
// e.mu; observers hear of it and of each eviction with origin.
func (e *Owner) putGateConv(k ConvKey, c *gateConv, origin string) {
	t := &e.gateConv
	if t.m == nil {
		t.m, t.byKey, t.use = map[ConvKey]*gateConv{}, map[uint64]ConvKey{}, map[string]int{}
	}
	e.dropGateConvLocked(k)
	t.m[k] = c
	t.order = append(t.order, k)
	for _, key := range c.keys {
		t.byKey[key] = k
	}
	if k.Tenant != "" {
		t.use[k.Tenant]++
	}
	e.notify(Change{Kind: ChangeConversation, Name: GateConversationName(k), Origin: origin})
	lc := e.opt.Latch
	maxConv := lc.MaxConversations
	if maxConv <= 0 {
		maxConv = DefaultMaxConversations
	}
	evict := func(old ConvKey) {
		e.dropGateConvLocked(old)
		e.notify(Change{Kind: ChangeConversation, Name: GateConversationName(old), Deleted: true, Origin: origin})
	}
	for k.Tenant != "" && lc.MaxPerTenant > 0 && t.use[k.Tenant] > lc.MaxPerTenant {
		for _, old := range t.order { // the tenant's own oldest; the new entry fits alone
			if old.Tenant == k.Tenant {
				evict(old)
				break
			}
		}
	}
	for len(t.order) > maxConv {
		evict(t.order[0])
	}
}

// dropGateConvLocked removes conversation k's entry, reporting whether there was one.
func (e *Owner) dropGateConvLocked(k ConvKey) bool {
	t := &e.gateConv
	c, ok := t.m[k]
	if !ok {
		return false
	}
	delete(t.m, k)
	for _, key := range c.keys {
		if t.byKey[key] == k {
			delete(t.byKey, key)
		}
	}
	for i, o := range t.order {
		if o == k {
			t.order = append(t.order[:i:i], t.order[i+1:]...)
			break
		}
	}
	if k.Tenant != "" {
		if t.use[k.Tenant]--; t.use[k.Tenant] == 0 {
			delete(t.use, k.Tenant)
		}
	}
	return true
}

// gateEngaged marks the gates of keys engaged (owner; OpGateEngaged). A key of no entry (an
// evicted conversation, a gate replaced since) is ignored.
func (e *Owner) gateEngaged(keys []uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := &e.gateConv
	for _, key := range keys {
		k, ok := t.byKey[key]
		if !ok {
			continue
		}
		c := t.m[k]
		for j, kk := range c.keys {
			if kk == key && !c.engaged[j] {
				c.engaged[j] = true
				e.notify(Change{Kind: ChangeConversation, Name: GateConversationName(k)})
			}
		}
	}
}

// reportEngaged tells the owner that a rest_of_conversation gate engaged (a Stepper's
// engageConv), off the step's path; a failure is logged (the Stepper remembers it anyway).
func (e *Engine) reportEngaged(key uint64) {
	go func() {
		if err := e.w.gateEngaged([]uint64{key}); err != nil {
			e.logf("shmsteer: telling the owner that a rest_of_conversation gate engaged failed (this worker still applies it; another may not): %v", err)
		}
	}()
}

// GateConversation encodes conversation k's rest_of_conversation gates (SGCV).
// found is false when the owner keeps none for k.
func (e *Owner) GateConversation(k ConvKey) (b []byte, found bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.gateConv.m[k]
	if !ok {
		return nil, false, nil
	}
	b, err = e.encodeGateConv(k, c)
	return b, err == nil, err
}

// GateConversations encodes every conversation's entry, oldest first, for a
// restore in the same order.
func (e *Owner) GateConversations() ([][]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([][]byte, 0, len(e.gateConv.order))
	for _, k := range e.gateConv.order {
		b, err := e.encodeGateConv(k, e.gateConv.m[k])
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// RestoreGateConversation decodes an SGCV entry (GateConversation's) and stores it as its
// conversation's newest, evicting to the caps. A named source keeps the digest it
// was latched with: an admission drops it if the vector registered now has another. Origin
// and If qualify it as they do a Register. Nothing changes on error (ErrBadEncoding, ErrBadGate).
func (e *Owner) RestoreGateConversation(b []byte, opts ...WriteOption) error {
	k, c, err := decodeGateConv(b, e.cfg)
	if err != nil {
		return err
	}
	o := writeOptsOf(opts)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := o.check(); err != nil {
		return err
	}
	e.putGateConv(k, c, o.origin)
	return nil
}

// DropGateConversation removes conversation k's entry, reporting whether there
// was one; Origin and If as for RestoreGateConversation.
func (e *Owner) DropGateConversation(k ConvKey, opts ...WriteOption) (bool, error) {
	o := writeOptsOf(opts)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := o.check(); err != nil {
		return false, err
	}
	if !e.dropGateConvLocked(k) {
		return false, nil
	}
	e.notify(Change{Kind: ChangeConversation, Name: GateConversationName(k), Deleted: true, Origin: o.origin})
	return true, nil
}

// GateConversationKey reads the conversation an SGCV entry is for (its header only;
// ErrBadEncoding).
func GateConversationKey(b []byte) (ConvKey, error) {
	if len(b) < gconvHdr || string(b[:4]) != gconvMagic || b[4] != gconvVersion {
		return ConvKey{}, fmt.Errorf("%w: conversation gates: no header", ErrBadEncoding)
	}
	tl, il := int(binary.LittleEndian.Uint16(b[6:])), int(binary.LittleEndian.Uint16(b[8:]))
	if il == 0 || len(b)-gconvHdr < tl+il {
		return ConvKey{}, fmt.Errorf("%w: conversation gates: tenant and id past the end", ErrBadEncoding)
	}
	return ConvKey{Tenant: string(b[gconvHdr : gconvHdr+tl]), ID: string(b[gconvHdr+tl : gconvHdr+tl+il])}, nil
}

// encodeGateConv encodes one entry (SGCV).
func (e *Engine) encodeGateConv(k ConvKey, c *gateConv) ([]byte, error) {
	b := append([]byte(gconvMagic), gconvVersion, byte(len(c.gates)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(k.Tenant)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(k.ID)))
	b = append(b, 0, 0)
	b = append(append(b, k.Tenant...), k.ID...)
	for i, g := range c.gates {
		var flags byte
		if c.engaged[i] {
			flags = 1
		}
		b = append(b, byte(g.When.Kind), byte(g.Scope), byte(g.Apply.Kind), flags)
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(g.When.Threshold))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(g.When.Sharpness))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(g.Apply.Strength))
		for j, src := range []*GateSource{&g.When.Probe, &g.Apply.Steer} {
			switch {
			case j == 0 && g.When.Kind != WhenProbe, j == 1 && g.Apply.Kind != ApplyAdd:
				b = append(b, 0)
			case src.Name != "":
				b = append(b, 1)
				b = binary.LittleEndian.AppendUint16(b, uint16(len(src.Name)))
				b = append(append(b, src.Name...), c.digests[i][j][:]...)
			default:
				w, err := resolveSteering(e.cfg, &Steering{Base: Tier{Vectors: src.Vectors}}, nil, false)
				if err != nil {
					return nil, err
				}
				wb, err := w.encode(e.cfg.Hidden)
				if err != nil {
					return nil, err
				}
				b = append(b, 2)
				b = binary.LittleEndian.AppendUint32(b, uint32(len(wb)))
				b = append(b, wb...)
			}
		}
	}
	return b, nil
}

// decodeGateConv parses an SGCV entry, checking every length against len(b), every gate as
// CheckGates does (scope rest_of_conversation only) and inline vectors against cfg. Nothing of
// the result aliases b.
func decodeGateConv(b []byte, cfg ModelConfig) (ConvKey, *gateConv, error) {
	bad := func(format string, args ...any) (ConvKey, *gateConv, error) {
		return ConvKey{}, nil, fmt.Errorf("%w: conversation gates: "+format, append([]any{ErrBadEncoding}, args...)...)
	}
	if len(b) < gconvHdr || string(b[:4]) != gconvMagic {
		return bad("no header")
	}
	if b[4] != gconvVersion {
		return bad("format version %d, this build reads %d", b[4], gconvVersion)
	}
	n := int(b[5])
	tl, il := int(binary.LittleEndian.Uint16(b[6:])), int(binary.LittleEndian.Uint16(b[8:]))
	if n == 0 || n > MaxGates || b[10] != 0 || b[11] != 0 {
		return bad("%d gates, reserved %d %d", n, b[10], b[11])
	}
	if tl > maxTenantLen || il == 0 || il > MaxIDLen || len(b)-gconvHdr < tl+il {
		return bad("tenant of %d bytes, id of %d", tl, il)
	}
	k := ConvKey{Tenant: string(b[gconvHdr : gconvHdr+tl]), ID: string(b[gconvHdr+tl : gconvHdr+tl+il])}
	rest := b[gconvHdr+tl+il:]
	conv := convHash(k)
	c := &gateConv{}
	for i := range n {
		if len(rest) < 16 {
			return bad("gate %d past the end", i)
		}
		var g Gate
		g.When.Kind, g.Scope, g.Apply.Kind = WhenKind(rest[0]), GateScope(rest[1]), ApplyKind(rest[2])
		flags := rest[3]
		g.When.Threshold = math.Float32frombits(binary.LittleEndian.Uint32(rest[4:]))
		g.When.Sharpness = math.Float32frombits(binary.LittleEndian.Uint32(rest[8:]))
		g.Apply.Strength = math.Float32frombits(binary.LittleEndian.Uint32(rest[12:]))
		if g.Scope != ScopeRestOfConversation || flags&^1 != 0 {
			return bad("gate %d: scope %d, flags %#x", i, rest[1], flags)
		}
		rest = rest[16:]
		var d [2]Digest
		for j, src := range []*GateSource{&g.When.Probe, &g.Apply.Steer} {
			if len(rest) < 1 {
				return bad("gate %d source %d past the end", i, j)
			}
			kind := rest[0]
			rest = rest[1:]
			switch kind {
			case 0:
			case 1:
				if len(rest) < 2 || len(rest)-2 < int(binary.LittleEndian.Uint16(rest))+32 {
					return bad("gate %d source %d name past the end", i, j)
				}
				nl := int(binary.LittleEndian.Uint16(rest))
				src.Name = string(rest[2 : 2+nl])
				if err := checkName(src.Name); err != nil {
					return ConvKey{}, nil, fmt.Errorf("conversation gates: gate %d: %w", i, err)
				}
				copy(d[j][:], rest[2+nl:])
				rest = rest[2+nl+32:]
			case 2:
				if len(rest) < 4 || uint64(len(rest)-4) < uint64(binary.LittleEndian.Uint32(rest)) {
					return bad("gate %d source %d vectors past the end", i, j)
				}
				wl := int(binary.LittleEndian.Uint32(rest))
				w, err := decode(bytes.Clone(rest[4:4+wl]), cfg, true) // aligned, and no alias of b
				if err != nil {
					return ConvKey{}, nil, fmt.Errorf("conversation gates: gate %d: %w", i, err)
				}
				st := w.steering(cfg)
				if len(w.vecs) == 0 || len(w.refs) != 0 || len(w.clamps) != 0 || len(st.Base.Vectors) != len(w.vecs) {
					return bad("gate %d source %d: inline sources hold base vectors only", i, j)
				}
				src.Vectors, d[j] = st.Base.Vectors, w.digest
				rest = rest[4+wl:]
			default:
				return bad("gate %d source %d of kind %d", i, j, kind)
			}
			if (kind != 0) != (j == 0 && g.When.Kind == WhenProbe || j == 1 && g.Apply.Kind == ApplyAdd) {
				return bad("gate %d sources do not match its kinds", i)
			}
		}
		if err := CheckGates([]Gate{g}); err != nil {
			return ConvKey{}, nil, fmt.Errorf("conversation gates: %w", err)
		}
		c.gates = append(c.gates, g)
		c.digests = append(c.digests, d)
		c.keys = append(c.keys, gateConvKey(conv, d[0], d[1], g.When.Kind, g.Apply.Kind))
		c.engaged = append(c.engaged, flags&1 != 0)
	}
	if len(rest) != 0 {
		return bad("%d trailing bytes", len(rest))
	}
	return k, c, nil
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
