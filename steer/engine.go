package steer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// Caller sends an RPC to the region's owner (an *ipc.Client satisfies it).
type Caller interface {
	Call(op uint16, req []byte) ([]byte, error)
}

// HandleFunc registers an RPC handler in the owner; with an *ipc.Owner o pass
//
//	func(op uint16, h func([]byte) ([]byte, error)) { o.Handle(op, h) }
type HandleFunc func(op uint16, h func(req []byte) ([]byte, error))

// RPC ops served by Engine.Serve (internal/proto's table).
const (
	OpRegister   uint16 = proto.OpRegister
	OpUnregister uint16 = proto.OpUnregister
)

// Options configure an Engine.
type Options struct {
	// Latch bounds the conversation latch map (owner only).
	Latch LatchConfig
	// Caller routes writes from a worker to the owner; nil in the owner.
	Caller Caller
	// Clients reports the attached client processes, for Status (owner; nil: unknown).
	Clients func() int
	// Logf receives warnings (default log.Printf).
	Logf func(format string, args ...any)
	// StrictRequests makes Stepper.Apply fail with ErrUnknownRequest when a span names a
	// request that has no admitted entry (never admitted, already ended, or a mistyped id)
	// instead of applying only the global steering to its rows. StepStats.UnknownRequests
	// counts such spans either way. For debugging and tests: in production a request may end
	// while a step that includes it is still running.
	StrictRequests bool
}

// Engine is the steering state of one process on one region: the owner (which writes it and
// runs the latches) or a worker (which reads it and sends writes to the owner). Safe for
// concurrent use; step apply goes through a Stepper per goroutine.
type Engine struct {
	r   *shm.Region
	cfg ModelConfig
	opt Options

	mu      sync.Mutex // owner: serializes steering writes (latch order is the call order)
	latches *Latches   // owner only
	deps    deps       // owner only: which sets reference which named vectors

	observers observers // OnChange callbacks (observe.go)
}

// VectorInfo identifies one version of a named vector.
type VectorInfo struct {
	Name    string
	Version uint64
	Digest  Digest
}

// Open binds an engine to a region. The region must have been created with RegionConfig; if
// want is not nil the recorded config must equal it, else ErrIncompatible naming both configs.
func Open(r *shm.Region, want *ModelConfig, opt Options) (*Engine, error) {
	cfg, err := ConfigOf(r)
	if err != nil {
		return nil, err
	}
	if want != nil && !cfg.Equal(*want) {
		return nil, fmt.Errorf("%w: model config mismatch: the region was created for hidden %d, %d layers, hooks %v; this process expects hidden %d, %d layers, hooks %v: start every process with the same model config",
			ErrIncompatible, cfg.Hidden, cfg.Layers, cfg.hooks(), want.Hidden, want.Layers, want.hooks())
	}
	e := &Engine{r: r, cfg: cfg, opt: opt}
	if r.IsOwner() {
		lc := opt.Latch
		if lc.Logf == nil {
			lc.Logf = opt.Logf
		}
		e.latches = NewLatches(lc)
	}
	return e, nil
}

// Config is the model config recorded in the region.
func (e *Engine) Config() ModelConfig { return e.cfg }

// Region is the underlying region.
func (e *Engine) Region() *shm.Region { return e.r }

// Latches is the owner's latch map (nil in workers).
func (e *Engine) Latches() *Latches { return e.latches }

func (e *Engine) ownerOnly() error {
	if !e.r.IsOwner() {
		return fmt.Errorf("%w: this operation runs in the owner (scheduler)", ErrNotOwner)
	}
	return nil
}

// Register validates vecs (finite values, hidden size, known hooks, layers in range, no
// duplicate (hook, layer), name ≤ MaxNameLen bytes) and stores them under name, replacing any
// earlier version (last writer wins). On a worker it sends them to the owner. Nothing is
// changed on failure.
func (e *Engine) Register(name string, vecs []Vector) (VectorInfo, error) {
	return e.register(name, vecs, writeOpts{})
}

func (e *Engine) register(name string, vecs []Vector, o writeOpts) (VectorInfo, error) {
	w, b, err := e.encodeNamed(name, vecs)
	if err != nil {
		return VectorInfo{}, err
	}
	if e.r.IsOwner() {
		v, err := e.writeNamed(name, b, o)
		if err != nil {
			return VectorInfo{}, fmt.Errorf("register %q: %w", name, err)
		}
		return VectorInfo{Name: name, Version: v, Digest: w.digest}, nil
	}
	if e.opt.Caller == nil {
		return VectorInfo{}, ErrNotOwner
	}
	return e.callRegister(OpRegister, name, b)
}

// Unregister deletes a named vector (from a worker, through the owner). Requests that reference
// it stop applying it at the next step; latches that reference it drop at their next bridge.
// References to it in the global steering are dropped and the global steering recomposed in
// the same transaction (deleted if nothing else is left), so later global merges keep
// working: the rewritten global entry carries the version Unregister returns, observers get a
// ChangeGlobal and Logf says so. ErrUnknownVector if it is not registered.
func (e *Engine) Unregister(name string) (uint64, error) { return e.unregister(name, writeOpts{}) }

func (e *Engine) unregister(name string, o writeOpts) (uint64, error) {
	if err := checkName(name); err != nil {
		return 0, err
	}
	if e.r.IsOwner() {
		return e.writeNamed(name, nil, o)
	}
	if e.opt.Caller == nil {
		return 0, ErrNotOwner
	}
	resp, err := e.call(OpUnregister, []byte(name))
	if err != nil {
		return 0, err
	}
	if len(resp) != 8 {
		return 0, fmt.Errorf("%w: unregister reply of %d bytes", ErrBadEncoding, len(resp))
	}
	return binary.LittleEndian.Uint64(resp), nil
}

// Vector reads a named vector at snapshot s without copying its floats.
func (e *Engine) Vector(s *shm.Snapshot, name string) (NamedVector, error) {
	return e.readNamed(s, KindVector, name)
}

// VectorInfos lists the named vectors at snapshot s (index order).
func (e *Engine) VectorInfos(s *shm.Snapshot) ([]VectorInfo, error) {
	return namedInfos(s, KindVector)
}

// SetGlobal replaces the global steering tiers (owner only). Refs must name registered
// vectors. An empty g clears global steering.
func (e *Engine) SetGlobal(g Steering) (uint64, error) { return e.setGlobal(g, writeOpts{}) }

func (e *Engine) setGlobal(g Steering, o writeOpts) (v uint64, err error) {
	if err := e.ownerOnly(); err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	defer o.done(e, &err, Change{Kind: ChangeGlobal, Deleted: g.Empty()}, &v) // observers, under the lock
	s, err := e.r.Snapshot()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	g.Compose = ComposeReplace
	w, err := resolveSteering(e.cfg, &g, digestAt(&s), false)
	if err != nil {
		return 0, fmt.Errorf("global steering: %w", err)
	}
	if err := checkMagnitude(e.cfg, &w, namedAt(&s, e.cfg), "global steering"); err != nil {
		return 0, err
	}
	if err := o.check(); err != nil {
		return 0, err
	}
	if g.Empty() {
		if _, _, err := s.View(KindGlobal, globalKey); errors.Is(err, shm.ErrNotFound) {
			return e.r.Version(), nil
		}
		v, err := e.r.Update(func(tx *shm.Tx) error {
			if err := tx.Delete(KindGlobal, globalKey); err != nil {
				return err
			}
			if err := tx.Delete(KindComposedGlobal, globalKey); err != nil && !errors.Is(err, shm.ErrNotFound) {
				return err
			}
			return nil
		})
		if err == nil {
			e.deps.set(globalDep, nil)
		}
		return v, err
	}
	b, err := w.encode(e.cfg.Hidden)
	if err != nil {
		return 0, err
	}
	v, err = e.r.Update(func(tx *shm.Tx) error {
		if err := tx.Put(KindGlobal, globalKey, b); err != nil {
			return err
		}
		return e.putComposed(tx, KindComposedGlobal, globalKey, &w, lookupAt(&s, "", nil), "global steering")
	})
	if err == nil {
		e.deps.set(globalDep, refNames(&w))
	}
	return v, err
}

func digestAt(s *shm.Snapshot) func(string) (Digest, bool) {
	return func(name string) (Digest, bool) {
		b, _, err := s.View(KindVector, name)
		if err != nil {
			return Digest{}, false
		}
		d, err := wireDigest(b)
		return d, err == nil
	}
}

// Admission is a request entering the scheduler.
type Admission struct {
	RequestID string
	// Conversation keys the latch; zero means the request is not part of a conversation.
	Conversation ConvKey
	// Override is the request's own steering; nil (or empty) inherits the conversation's latch.
	Override *Steering
}

// Source says where a request's admitted steering came from.
type Source uint8

const (
	SourceNone     Source = iota // no request steering (global steering still applies)
	SourceOverride               // the request's own override
	SourceLatch                  // its conversation's latch (a bridge)
	SourceComposed               // the latch plus the override (ComposeAdd)
)

func (s Source) String() string {
	switch s {
	case SourceNone:
		return "none"
	case SourceOverride:
		return "override"
	case SourceLatch:
		return "latch"
	case SourceComposed:
		return "composed"
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// Admitted is the outcome of Admit.
type Admitted struct {
	Version uint64 // region version that published it
	Source  Source
	Latched bool   // the override was latched onto the conversation
	Refused bool   // the override was too large to latch (it still steers this request)
	Digest  Digest // digest of the published request entry (zero for SourceNone)
}

// Admit decides the steering of a request (owner only): its override, its conversation's latch,
// or both (Override.Compose), runs the latch operation, and publishes the result under
// KindRequest so every rank reads it. A request with no request steering gets an empty entry
// (64 bytes), so Steppers can tell it from an id that was never admitted (StepStats). Invalid overrides fail with a typed error before anything
// changes.
func (e *Engine) Admit(a Admission) (Admitted, error) {
	if err := e.ownerOnly(); err != nil {
		return Admitted{}, err
	}
	if len(a.RequestID) == 0 || len(a.RequestID) > MaxIDLen {
		return Admitted{}, fmt.Errorf("%w (%d bytes)", ErrBadRequestID, len(a.RequestID))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	snap, err := e.r.Snapshot()
	if err != nil {
		return Admitted{}, err
	}
	defer snap.Close()
	digestOf := digestAt(&snap)
	var out Admitted
	var final Steering
	override := a.Override != nil && !a.Override.Empty()
	named := namedAt(&snap, e.cfg)
	set := fmt.Sprintf("request %q", a.RequestID)
	if override {
		w, err := resolveSteering(e.cfg, a.Override, digestOf, false)
		if err != nil {
			return Admitted{}, err
		}
		if err := checkMagnitude(e.cfg, &w, named, set); err != nil {
			return Admitted{}, err
		}
		// The override composed with its conversation's latch must fit as well; check before
		// any latch operation so a refusal changes nothing.
		if a.Override.Compose == ComposeAdd && !a.Conversation.zero() {
			if prev, ok := e.latches.peek(a.Conversation, digestOf); ok {
				m := mergeSteering(&prev, a.Override)
				mw, err := resolveSteering(e.cfg, &m, digestOf, true)
				if err == nil {
					err = checkMagnitude(e.cfg, &mw, named, set+" (latched steering + override)")
				}
				if err != nil {
					return Admitted{}, err
				}
			}
		}
		final, out.Source = *a.Override, SourceOverride
		if !a.Conversation.zero() {
			if a.Override.Compose == ComposeAdd {
				if prev, ok := e.latches.Bridge(a.Conversation, digestOf); ok {
					final, out.Source = mergeSteering(&prev, a.Override), SourceComposed
				}
			}
			pins := pinsOf(&final, digestOf)
			out.Latched, out.Refused = e.latches.trigger(a.Conversation, &final, pins)
		}
	} else if !a.Conversation.zero() {
		if prev, ok := e.latches.Bridge(a.Conversation, digestOf); ok {
			final, out.Source = prev, SourceLatch
		}
	}
	// An empty steering set marks a request admitted without request steering.
	w, err := resolveSteering(e.cfg, &Steering{}, nil, false)
	if err != nil {
		return out, err
	}
	if out.Source != SourceNone {
		if w, err = resolveSteering(e.cfg, &final, digestOf, true); err == nil {
			err = checkMagnitude(e.cfg, &w, named, set)
		}
		if err != nil {
			return out, err // cannot happen: every part was validated
		}
	}
	enc, err := w.encode(e.cfg.Hidden)
	if err != nil {
		return out, err
	}
	if out.Source != SourceNone {
		out.Digest = w.digest
	}
	stats := e.latches.Stats()
	out.Version, err = e.r.Update(func(tx *shm.Tx) error {
		if err := tx.Put(KindRequest, a.RequestID, enc); err != nil {
			return err
		}
		if err := e.putComposed(tx, KindComposed, a.RequestID, &w, lookupAt(&snap, "", nil), set); err != nil {
			return err
		}
		return tx.Put(KindStatus, statusKey, encodeLatchStats(stats))
	})
	if err != nil {
		return out, fmt.Errorf("admit %q: %w", a.RequestID, err)
	}
	e.deps.set(a.RequestID, refNames(&w))
	return out, nil
}

// pinsOf lists the digest of every named vector final references (each name once, in order).
func pinsOf(final *Steering, digestOf func(string) (Digest, bool)) []Pin {
	var pins []Pin
	for _, t := range []*Tier{&final.Base, &final.Prefill, &final.Decode} {
	next:
		for _, r := range t.Refs {
			for _, p := range pins {
				if p.Name == r.Name {
					continue next
				}
			}
			d, _ := digestOf(r.Name)
			pins = append(pins, Pin{Name: r.Name, Digest: d})
		}
	}
	return pins
}

// End removes a finished request's steering (owner only). Its conversation's latch stays.
func (e *Engine) End(requestID string) (uint64, error) {
	if err := e.ownerOnly(); err != nil {
		return 0, err
	}
	if len(requestID) == 0 || len(requestID) > MaxIDLen {
		return 0, fmt.Errorf("%w (%d bytes)", ErrBadRequestID, len(requestID))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	v, err := e.r.Update(func(tx *shm.Tx) error {
		if err := tx.Delete(KindRequest, requestID); err != nil {
			return err
		}
		if err := tx.Delete(KindComposed, requestID); err != nil && !errors.Is(err, shm.ErrNotFound) {
			return err
		}
		return nil
	})
	if errors.Is(err, shm.ErrNotFound) {
		return e.r.Version(), nil
	}
	if err == nil {
		e.deps.set(requestID, nil)
	}
	return v, err
}

// DropConversation removes a conversation's latch (owner only), e.g. when it is closed.
func (e *Engine) DropConversation(k ConvKey) (bool, error) {
	if err := e.ownerOnly(); err != nil {
		return false, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ok := e.latches.Drop(k)
	_, err := e.r.Put(KindStatus, statusKey, encodeLatchStats(e.latches.Stats()))
	return ok, err
}

// Status is a point-in-time summary of the steering state, the same from any process (the latch
// counters are published by the owner at each admission).
type Status struct {
	Version              uint64 `json:"version"`
	LatchedConversations int    `json:"latched_conversations"`
	LatchedBytes         int64  `json:"latched_bytes"`
	Evictions            uint64 `json:"evictions"`
	OversizeRefusals     uint64 `json:"oversize_refusals"`
	Triggers             uint64 `json:"triggers"`
	Bridges              uint64 `json:"bridges"`
	BridgeDrops          uint64 `json:"bridge_drops"`
	LatchingOff          bool   `json:"latching_off"` // latching turned off (LatchOff)
	NamedVectors         int    `json:"named_vectors"`
	AdmittedRequests     int    `json:"admitted_requests"` // admitted and not ended
	RequestsWithSteering int    `json:"requests_with_steering"`
	Keys                 int    `json:"keys"`
	ArenaUsed            uint64 `json:"arena_bytes_used"`
	ArenaFree            uint64 `json:"arena_bytes_free"`
	AttachedClients      int    `json:"attached_clients"` // -1: unknown in this process
	// Keys counts live keys; RevokedKeys the revoked sentinels standing (in the mark table).
	RevokedKeys int `json:"revoked_keys"`
	// IndexSlots and the mark table's use, for capacity planning.
	IndexSlots  uint64 `json:"index_slots"`
	MarkEntries uint64 `json:"mark_entries_used"`
	MarkSlots   uint64 `json:"mark_slots"`
	// OldestPin is the reader pinned at the lowest version, the one holding reclamation back
	// (nil when no reader is pinned). An age of seconds means a stuck worker or a snapshot
	// left open: end that process (its slots are freed within a second) or close the snapshot.
	OldestPin *PinStatus `json:"oldest_pin,omitempty"`
}

// PinStatus describes a pinned reader slot (shm.PinInfo).
type PinStatus struct {
	Slot       int     `json:"slot"`
	PID        int     `json:"pid"` // as the holder sees itself (its own PID namespace)
	Version    uint64  `json:"version"`
	AgeSeconds float64 `json:"age_seconds"`
}

// Status reads the current state.
func (e *Engine) Status() (Status, error) {
	rs := e.r.Stats() // before our own snapshot pins: it must not report itself as the oldest pin
	s, err := e.r.Snapshot()
	if err != nil {
		return Status{}, err
	}
	defer s.Close()
	st := Status{Version: s.Version(), AttachedClients: -1}
	if e.opt.Clients != nil {
		st.AttachedClients = e.opt.Clients()
	}
	if b, _, err := s.View(KindStatus, statusKey); err == nil {
		ls := decodeLatchStats(b)
		st.LatchedConversations, st.LatchedBytes = ls.Conversations, ls.Bytes
		st.Evictions, st.OversizeRefusals, st.Triggers, st.Bridges, st.BridgeDrops = ls.Evictions, ls.OversizeRefusals, ls.Triggers, ls.Bridges, ls.BridgeDrops
		st.LatchingOff = ls.Off
	} else if e.latches != nil {
		// No admission yet: the owner still knows whether latching is off.
		st.LatchingOff = e.latches.Stats().Off
	}
	for _, c := range []struct {
		k shm.Kind
		n *int
	}{{KindVector, &st.NamedVectors}, {KindRequest, &st.AdmittedRequests}, {proto.KindKey, &st.Keys}} {
		if *c.n, err = s.Len(c.k); err != nil {
			return st, err
		}
	}
	err = s.Range(KindRequest, func(_, value []byte, _ uint64) bool {
		if len(value) > hdrSize { // more than the empty set's header
			st.RequestsWithSteering++
		}
		return true
	})
	if err != nil {
		return st, err
	}
	st.ArenaUsed, st.ArenaFree = rs.AllocBytes, rs.ArenaBytes-rs.AllocBytes
	st.RevokedKeys = int(rs.Marks)
	st.IndexSlots, st.MarkEntries, st.MarkSlots = rs.IndexSlots, rs.MarkEntries, rs.MarkSlots
	if p := rs.OldestPin; p.Version != 0 {
		st.OldestPin = &PinStatus{Slot: p.Slot, PID: p.PID, Version: p.Version, AgeSeconds: p.Age.Seconds()}
	}
	return st, nil
}

func encodeLatchStats(s LatchStats) []byte {
	b := make([]byte, 0, 64)
	for _, x := range []uint64{uint64(s.Conversations), uint64(s.Bytes), s.Evictions, s.OversizeRefusals, s.Triggers, s.Bridges, s.BridgeDrops, latchFlags(s)} {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return b
}

func decodeLatchStats(b []byte) LatchStats {
	var x [8]uint64
	for i := range x {
		if len(b) >= 8*(i+1) {
			x[i] = binary.LittleEndian.Uint64(b[8*i:])
		}
	}
	return LatchStats{Conversations: int(x[0]), Bytes: int64(x[1]), Evictions: x[2], OversizeRefusals: x[3], Triggers: x[4], Bridges: x[5], BridgeDrops: x[6], Off: x[7]&1 != 0}
}

// Serve registers the owner's handlers for worker writes (OpRegister, OpUnregister and the
// probe ops). The owner re-validates everything it receives: a worker's bytes are not trusted.
// A handler's error reaches the worker as the same sentinel (internal/proto's codes, bound in
// this package).
func (e *Engine) Serve(handle HandleFunc) {
	handle(OpRegister, e.serveRegister(e.Register))
	handle(OpUnregister, serveUnregister(e.Unregister))
	handle(OpRegisterProbe, e.serveRegister(e.RegisterProbe))
	handle(OpUnregisterProbe, serveUnregister(e.UnregisterProbe))
}

func init() {
	// The order is the precedence for an error that wraps several: the specific first.
	proto.Bind(
		proto.Pair{Code: proto.CodeBadName, Err: ErrBadName},
		proto.Pair{Code: proto.CodeNonFinite, Err: ErrNonFinite},
		proto.Pair{Code: proto.CodeHiddenSize, Err: ErrHiddenSize},
		proto.Pair{Code: proto.CodeUnknownHook, Err: ErrUnknownHook},
		proto.Pair{Code: proto.CodeLayerRange, Err: ErrLayerRange},
		proto.Pair{Code: proto.CodeDuplicate, Err: ErrDuplicate},
		proto.Pair{Code: proto.CodeBadClamp, Err: ErrBadClamp},
		proto.Pair{Code: proto.CodeUnknownVector, Err: ErrUnknownVector},
		proto.Pair{Code: proto.CodeBadEncoding, Err: ErrBadEncoding},
		proto.Pair{Code: proto.CodeEmptySet, Err: ErrEmptySet},
		proto.Pair{Code: proto.CodeOverflow, Err: ErrOverflow},
		proto.Pair{Code: proto.CodeBadRequestID, Err: ErrBadRequestID},
		proto.Pair{Code: proto.CodeNotOwner, Err: ErrNotOwner},
		proto.Pair{Code: proto.CodeSteerConfig, Err: ErrIncompatible},
		proto.Pair{Code: proto.CodeProbeSite, Err: ErrProbeSite},
	)
}

// call sends one RPC to the owner. An owner without the op's handler gives ErrNotServed (with
// proto.ErrUnknownOp); an error code this build does not know gives ErrRemote.
func (e *Engine) call(op uint16, req []byte) ([]byte, error) {
	resp, err := e.opt.Caller.Call(op, req)
	if errors.Is(err, proto.ErrUnknownOp) {
		return nil, fmt.Errorf("%w (%w)", ErrNotServed, err)
	}
	var re *proto.RemoteError
	if errors.As(err, &re) && !re.Known() {
		return nil, fmt.Errorf("%w: %w", ErrRemote, err)
	}
	return resp, err
}
