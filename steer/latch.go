package steer

import (
	"container/list"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"log"
	"math"
	"sync"
	"time"
)

// Latch defaults, as in the reference design.
const (
	DefaultMaxConversations       = 1024
	DefaultMaxLatchedBytes  int64 = 256 << 20
	DefaultWarnEvery              = 10 * time.Second
)

// LatchOff, as LatchConfig.MaxConversations or MaxLatchedBytes (any negative value does),
// turns latching off: no override is latched, no request is bridged, LatchStats.Off (and
// Status.LatchingOff) says so and Triggers still counts the overrides offered. Zero means the
// default, not off.
const LatchOff = -1

// LatchPolicy chooses which latch is evicted first when a cap is exceeded.
type LatchPolicy uint8

const (
	// FIFO evicts the conversation latched longest ago (re-triggering counts as a new latch).
	FIFO LatchPolicy = iota
	// LRU evicts the conversation latched or bridged longest ago.
	LRU
)

// LatchConfig bounds the conversation latch map. Zero fields take the defaults; a negative cap
// (LatchOff) turns latching off.
type LatchConfig struct {
	MaxConversations int   // count cap (0: default 1024; LatchOff: no latching)
	MaxLatchedBytes  int64 // byte cap over by-value latches (0: default 256 MiB; LatchOff: no latching)
	Policy           LatchPolicy
	// MaxPerTenant and MaxTenantBytes cap one tenant's latches (ConvKey.Tenant non-empty; 0:
	// no per-tenant cap): a tenant at its cap evicts its own oldest latch first, so that one
	// tenant cannot evict another's while the per-tenant caps sum to no more than the caps
	// above. The conversations without a tenant have the caps above only.
	MaxPerTenant   int
	MaxTenantBytes int64
	// WarnEvery rate-limits the warnings for refused oversize overrides and dropped bridges
	// (per kind of warning); the counters count every event.
	WarnEvery time.Duration
	// Logf receives the warnings (default log.Printf).
	Logf func(format string, args ...any)
}

// ConvKey names a conversation within a tenant: two tenants using the same conversation id
// never share a latch. An empty ID means "no conversation", whatever the tenant: such a
// request neither latches nor bridges.
type ConvKey struct {
	Tenant string
	ID     string
}

func (k ConvKey) zero() bool { return k.ID == "" }

// Pin records the digest of a named vector a by-reference latch relies on.
type Pin struct {
	Name   string
	Digest Digest
}

// LatchStats are the latch counters.
type LatchStats struct {
	Conversations    int    // latched conversations now
	Bytes            int64  // bytes of by-value latched data now
	Evictions        uint64 // latches evicted to fit a cap
	OversizeRefusals uint64 // overrides larger than the byte cap, not latched
	Triggers         uint64 // overrides offered for latching
	Bridges          uint64 // requests that inherited their conversation's latch
	BridgeDrops      uint64 // latches dropped at bridge: a named vector gone or changed
	Off              bool   // latching is turned off (LatchOff)
}

// Latches is the conversation latch map: the steering override of a conversation's last
// steered request, applied to its later requests (a bridge) until replaced, dropped or evicted.
// It lives in the owner's private memory; every method is deterministic in the sequence of
// calls (time only rate-limits log lines), so replaying the same operations gives the same
// state in any process. Safe for concurrent use.
type Latches struct {
	mu    sync.Mutex
	cfg   LatchConfig
	order *list.List // of *latch, oldest first
	byKey map[ConvKey]*list.Element
	use   map[string]tenantUse // per non-empty tenant
	st    LatchStats
	warn  [2]warnState
}

type latch struct {
	key   ConvKey
	s     Steering
	pins  []Pin
	bytes int64
}

// tenantUse is what one tenant's latches hold.
type tenantUse struct {
	n     int
	bytes int64
}

// TenantUse returns how many latches tenant holds and their bytes (by-value data).
func (l *Latches) TenantUse(tenant string) (conversations int, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tenant == "" {
		for el := l.order.Front(); el != nil; el = el.Next() {
			if e := el.Value.(*latch); e.key.Tenant == "" {
				conversations++
				bytes += e.bytes
			}
		}
		return conversations, bytes
	}
	u := l.use[tenant]
	return u.n, u.bytes
}

func (l *Latches) account(e *latch, sign int) {
	if e.key.Tenant == "" {
		return
	}
	u := l.use[e.key.Tenant]
	u.n += sign
	u.bytes += int64(sign) * e.bytes
	if u.n == 0 {
		delete(l.use, e.key.Tenant)
	} else {
		l.use[e.key.Tenant] = u
	}
}

// overTenant reports whether tenant t holds more than its caps.
func (l *Latches) overTenant(t string) bool {
	if t == "" {
		return false
	}
	u := l.use[t]
	return (l.cfg.MaxPerTenant > 0 && u.n > l.cfg.MaxPerTenant) || (l.cfg.MaxTenantBytes > 0 && u.bytes > l.cfg.MaxTenantBytes)
}

// oldestOf returns tenant t's latch next in eviction order.
func (l *Latches) oldestOf(t string) *latch {
	for el := l.order.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*latch); e.key.Tenant == t {
			return e
		}
	}
	return nil
}

type warnState struct {
	last       time.Time
	suppressed uint64
}

// NewLatches makes an empty latch map.
func NewLatches(cfg LatchConfig) *Latches {
	off := cfg.MaxConversations < 0 || cfg.MaxLatchedBytes < 0
	if cfg.MaxConversations == 0 {
		cfg.MaxConversations = DefaultMaxConversations
	}
	if cfg.MaxLatchedBytes == 0 {
		cfg.MaxLatchedBytes = DefaultMaxLatchedBytes
	}
	if cfg.WarnEvery <= 0 {
		cfg.WarnEvery = DefaultWarnEvery
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	return &Latches{cfg: cfg, order: list.New(), byKey: map[ConvKey]*list.Element{}, use: map[string]tenantUse{}, st: LatchStats{Off: off}}
}

// LatchBytes is what latching s costs against the byte cap: the float data it holds by value
// (inline vectors and clamp directions). References cost nothing: their data stays in the named
// vector, stored once in the region.
func LatchBytes(s *Steering) int64 {
	var n int64
	for _, t := range []*Tier{&s.Base, &s.Prefill, &s.Decode} {
		for _, v := range t.Vectors {
			n += 4 * int64(len(v.Data))
		}
		for _, c := range t.Clamps {
			n += 4 * int64(len(c.Dir))
		}
	}
	return n
}

// Trigger latches s (copied) onto conversation k, replacing any older latch of k, and evicts
// oldest-first until both caps fit. pins are the digests of the named vectors s references,
// checked at each bridge. An s larger than the byte cap alone is refused (counted, warned):
// the older latch of k is still dropped, and the caller still applies s to the triggering
// request. An empty s just drops k's latch. With latching off (LatchOff) nothing is latched.
// It reports whether s was latched.
func (l *Latches) Trigger(k ConvKey, s *Steering, pins []Pin) bool {
	latched, _ := l.trigger(k, s, pins)
	return latched
}

// trigger is Trigger, also reporting whether s was refused for its size.
func (l *Latches) trigger(k ConvKey, s *Steering, pins []Pin) (latched, oversize bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st.Triggers++
	l.dropLocked(k)
	if s.Empty() || l.st.Off {
		return false, false
	}
	n := LatchBytes(s)
	if n > l.cfg.MaxLatchedBytes || (k.Tenant != "" && l.cfg.MaxTenantBytes > 0 && n > l.cfg.MaxTenantBytes) {
		l.st.OversizeRefusals++
		limit, what := l.cfg.MaxLatchedBytes, "max_latched_bytes"
		if n <= limit {
			limit, what = l.cfg.MaxTenantBytes, "the tenant's max_latched_bytes"
		}
		l.warnf(0, "shmsteer: steering override of %d bytes for conversation %q/%q exceeds %s %d; not latched (it still steers its own request)",
			n, k.Tenant, k.ID, what, limit)
		return false, true
	}
	e := &latch{key: k, s: cloneSteering(s), pins: append([]Pin(nil), pins...), bytes: n}
	l.byKey[k] = l.order.PushBack(e)
	l.st.Bytes += n
	l.st.Conversations++
	l.account(e, 1)
	for l.overTenant(k.Tenant) {
		// The tenant's own oldest first; the new latch fits the tenant's caps alone.
		l.dropLocked(l.oldestOf(k.Tenant).key)
		l.st.Evictions++
	}
	for l.st.Conversations > l.cfg.MaxConversations || l.st.Bytes > l.cfg.MaxLatchedBytes {
		// The new latch fits both caps alone, so the loop stops before reaching it.
		old := l.order.Front().Value.(*latch)
		l.dropLocked(old.key)
		l.st.Evictions++
	}
	return true, false
}

// Bridge returns the steering latched on k for a request that brings no override. current
// returns the digest a named vector has now (ok false if it is gone); a pin that is missing or
// changed drops the latch (counted, warned). Under LRU a bridge makes k the most recent. The
// returned steering is shared: do not modify it.
func (l *Latches) Bridge(k ConvKey, current func(name string) (Digest, bool)) (Steering, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	el, ok := l.byKey[k]
	if !ok {
		return Steering{}, false
	}
	e := el.Value.(*latch)
	for _, p := range e.pins {
		if d, ok := current(p.Name); !ok || d != p.Digest {
			l.dropLocked(k)
			l.st.BridgeDrops++
			why := "was unregistered"
			if ok {
				why = "changed (digest " + d.String()[:12] + ", latched " + p.Digest.String()[:12] + ")"
			}
			l.warnf(1, "shmsteer: latch of conversation %q/%q dropped: named vector %q %s", k.Tenant, k.ID, p.Name, why)
			return Steering{}, false
		}
	}
	l.st.Bridges++
	if l.cfg.Policy == LRU {
		l.order.MoveToBack(el)
	}
	return e.s, true
}

// peek returns what Bridge would return for k, without any of its effects (no drop, no count,
// no LRU move), so Admit can check a composition before it changes the latch map.
func (l *Latches) peek(k ConvKey, current func(name string) (Digest, bool)) (Steering, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	el, ok := l.byKey[k]
	if !ok {
		return Steering{}, false
	}
	e := el.Value.(*latch)
	for _, p := range e.pins {
		if d, ok := current(p.Name); !ok || d != p.Digest {
			return Steering{}, false
		}
	}
	return e.s, true
}

// Drop removes k's latch, reporting whether there was one.
func (l *Latches) Drop(k ConvKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropLocked(k)
}

func (l *Latches) dropLocked(k ConvKey) bool {
	el, ok := l.byKey[k]
	if !ok {
		return false
	}
	e := l.order.Remove(el).(*latch)
	delete(l.byKey, k)
	l.account(e, -1)
	l.st.Bytes -= e.bytes
	l.st.Conversations--
	return true
}

// Stats returns the counters.
func (l *Latches) Stats() LatchStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

// Keys lists the latched conversations in eviction order (next to be evicted first).
func (l *Latches) Keys() []ConvKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]ConvKey, 0, l.order.Len())
	for el := l.order.Front(); el != nil; el = el.Next() {
		out = append(out, el.Value.(*latch).key)
	}
	return out
}

// StateHash is a 64-bit FNV-1a hash of the whole latch state (eviction order, contents, pins
// and counters), for checking that two processes replaying the same operations agree.
func (l *Latches) StateHash() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := fnv.New64a()
	var b [8]byte
	u := func(x uint64) { binary.LittleEndian.PutUint64(b[:], x); h.Write(b[:]) }
	str := func(s string) { u(uint64(len(s))); h.Write([]byte(s)) }
	fl := func(v []float32) {
		u(uint64(len(v)))
		for _, f := range v {
			u(uint64(math.Float32bits(f)))
		}
	}
	for el := l.order.Front(); el != nil; el = el.Next() {
		e := el.Value.(*latch)
		str(e.key.Tenant)
		str(e.key.ID)
		u(uint64(e.bytes))
		u(uint64(e.s.Compose))
		for _, t := range []*Tier{&e.s.Base, &e.s.Prefill, &e.s.Decode} {
			for _, v := range t.Vectors {
				str(v.Hook)
				u(uint64(v.Layer))
				u(uint64(math.Float32bits(v.Scale)))
				fl(v.Data)
			}
			for _, r := range t.Refs {
				str(r.Name)
				u(uint64(math.Float32bits(r.Strength)))
			}
			for _, c := range t.Clamps {
				str(c.Hook)
				u(uint64(c.Layer))
				fl(c.Dir)
				fl([]float32{c.Min, c.Max, c.Strength})
			}
		}
		for _, p := range e.pins {
			str(p.Name)
			h.Write(p.Digest[:])
		}
	}
	st := l.st
	for _, x := range []uint64{uint64(st.Conversations), uint64(st.Bytes), st.Evictions, st.OversizeRefusals, st.Triggers, st.Bridges, st.BridgeDrops, latchFlags(st)} {
		u(x)
	}
	return h.Sum64()
}

// warnf logs at most one line per WarnEvery for warning kind i, noting how many it skipped.
func (l *Latches) warnf(i int, format string, args ...any) {
	w := &l.warn[i]
	now := time.Now()
	if !w.last.IsZero() && now.Sub(w.last) < l.cfg.WarnEvery {
		w.suppressed++
		return
	}
	if w.suppressed > 0 {
		format += fmt.Sprintf(" (%d similar warnings suppressed)", w.suppressed)
	}
	w.last, w.suppressed = now, 0
	l.cfg.Logf(format, args...)
}

// cloneSteering deep-copies s, so a latch never aliases caller or region memory.
func cloneSteering(s *Steering) Steering {
	out := Steering{Compose: s.Compose}
	for _, p := range []Phase{PhaseBase, PhasePrefill, PhaseDecode} {
		src, dst := s.Tier(p), out.Tier(p)
		for _, v := range src.Vectors {
			v.Data = append([]float32(nil), v.Data...)
			dst.Vectors = append(dst.Vectors, v)
		}
		dst.Refs = append([]Ref(nil), src.Refs...)
		for _, c := range src.Clamps {
			c.Dir = append([]float32(nil), c.Dir...)
			dst.Clamps = append(dst.Clamps, c)
		}
	}
	return out
}

// mergeSteering is a's terms followed by b's (ComposeAdd); the result aliases both.
func mergeSteering(a, b *Steering) Steering {
	out := Steering{Compose: b.Compose}
	for _, p := range []Phase{PhaseBase, PhasePrefill, PhaseDecode} {
		ta, tb, t := a.Tier(p), b.Tier(p), out.Tier(p)
		t.Vectors = append(append([]Vector(nil), ta.Vectors...), tb.Vectors...)
		t.Refs = append(append([]Ref(nil), ta.Refs...), tb.Refs...)
		t.Clamps = append(append([]Clamp(nil), ta.Clamps...), tb.Clamps...)
	}
	return out
}

// latchFlags packs LatchStats' booleans (bit 0: Off) for the region's status entry and
// StateHash.
func latchFlags(st LatchStats) uint64 {
	if st.Off {
		return 1
	}
	return 0
}
