package steer

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// Options configure an Owner (Open) or a Worker (Attach).
type Options struct {
	// Latch bounds the conversation latch map (owner only).
	Latch LatchConfig
	// Caller routes writes from a worker to the owner (ignored in the owner, which writes
	// locally). A worker without one reads only: its writes fail with ErrNotOwner.
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
	// CaptureConsumers are the capture consumers the owner declares, by name, each with the
	// validator of its spec format (package capture builds them: capture.Validators). An
	// admission's capture may name only these (ErrCaptureConsumer). Owner only.
	CaptureConsumers map[string]CaptureValidator
	// CaptureGlobal are the declared consumers' global specs, by consumer name (package
	// capture builds them: capture.GlobalSpecs): a request whose capture does not name such a
	// consumer is captured for it with its global spec (a request's own spec for a consumer
	// replaces that consumer's global one, as in the fork). Each names a declared consumer and
	// is validated at Open as a request's spec is (ErrCaptureConsumer wrapping the
	// validator's error). Owner only.
	CaptureGlobal map[string]CaptureGlobalSpec
}

// Engine is what the owner and a worker have in common on one region: the reads (named
// vectors, probes, the global tiers, a request's gates and capture, Status), the writes both
// sides make (Register, Unregister, RegisterProbe, UnregisterProbe, SetGlobal: a local
// transaction in the owner, an RPC to it in a worker) and the Steppers. A process gets one
// through its side: an Owner (Open) or a Worker (Attach), which embed it; a function that
// serves either side takes the *Engine (Owner.Engine, Worker.Engine). Safe for concurrent use;
// step apply goes through a Stepper per goroutine.
type Engine struct {
	r   *shm.Region
	cfg ModelConfig
	opt Options
	// pool is the region's column pool; poolFits whether it fits the model (one cell per
	// (hook, layer), hidden floats a cell), so the owner puts requests' vectors there.
	pool     shm.ColumnPool
	poolFits bool

	w writer // how writes reach the region (writer.go), chosen once by Open or Attach
}

// VectorInfo identifies one version of a named vector.
type VectorInfo struct {
	Name    string
	Version uint64
	Digest  Digest
	// ModelHint is the steering vector's model hint (VectorMeta; "" if none, and for probes).
	ModelHint string
}

// openEngine binds the side-independent part to a region. The region must have been created
// with RegionConfig; if want is not nil the recorded config must equal it, else ErrIncompatible
// naming both configs. The caller sets the writer.
func openEngine(r *shm.Region, want *ModelConfig, opt Options) (*Engine, error) {
	cfg, err := ConfigOf(r)
	if err != nil {
		return nil, err
	}
	if want != nil && !cfg.Equal(*want) {
		return nil, fmt.Errorf("%w: model config mismatch: the region was created for hidden %d, %d layers, hooks %v; this process expects hidden %d, %d layers, hooks %v: start every process with the same model config",
			ErrIncompatible, cfg.Hidden, cfg.Layers, cfg.hooks(), want.Hidden, want.Layers, want.hooks())
	}
	e := &Engine{r: r, cfg: cfg, opt: opt, pool: r.Columns()}
	if n, cells, b := e.pool.Geometry(); n > 0 && cells == cfg.NumHooks()*cfg.Layers && b >= 4*cfg.Hidden {
		e.poolFits = true
	}
	return e, nil
}

// Config is the model config recorded in the region.
func (e *Engine) Config() ModelConfig { return e.cfg }

// Region is the underlying region.
func (e *Engine) Region() *shm.Region { return e.r }

// Register validates vecs (finite values, hidden size, known hooks, layers in range, no
// duplicate (hook, layer), name ≤ MaxNameLen bytes) and stores them under name, replacing any
// earlier version (last writer wins). On a worker it sends them to the owner.
// opts tag the write (Origin, If; owner only) and give the vector its model hint (ModelHint,
// stored with it; without it the vector has none). Nothing is changed on failure.
func (e *Engine) Register(name string, vecs []Vector, opts ...WriteOption) (VectorInfo, error) {
	o := writeOptsOf(opts)
	if err := CheckModelHint(o.hint); err != nil {
		return VectorInfo{}, fmt.Errorf("register %q: %w", name, err)
	}
	w, b, err := e.encodeNamed(name, vecs)
	if err != nil {
		return VectorInfo{}, err
	}
	info, err := e.w.putNamed(KindVector, name, b, w.digest, o)
	info.ModelHint = o.hint
	return info, err
}

// Unregister deletes a named vector (from a worker, through the owner). Requests that reference
// it stop applying it at the next step; latches that reference it drop at their next bridge.
// References to it in the global steering are dropped and the global steering recomposed in
// the same transaction (deleted if nothing else is left), so later global merges keep
// working: the rewritten global entry carries the version Unregister returns, observers get a
// ChangeGlobal and Logf says so. ErrUnknownVector if it is not registered.
func (e *Engine) Unregister(name string, opts ...WriteOption) (uint64, error) {
	if err := checkName(name); err != nil {
		return 0, err
	}
	return e.w.deleteNamed(KindVector, name, writeOptsOf(opts))
}

// Vector reads a named vector at snapshot s without copying its floats.
func (e *Engine) Vector(s *shm.Snapshot, name string) (NamedVector, error) {
	return e.readNamed(s, KindVector, name)
}

// VectorInfos lists the named vectors at snapshot s (index order).
func (e *Engine) VectorInfos(s *shm.Snapshot) ([]VectorInfo, error) {
	out, err := namedInfos(s, KindVector)
	for i := range out {
		if err != nil {
			break
		}
		var m VectorMeta
		m, err = e.VectorMeta(s, out[i].Name)
		out[i].ModelHint = m.ModelHint
	}
	return out, err
}

// SetGlobal replaces the global steering tiers with g, or with Merge merges g into them per
// site (MergeSites), in the owner under its write lock: a merge from a worker or the CLI is
// one owner-side operation, so concurrent merges never lose each other's sites. Refs must
// name registered vectors. An empty g clears global steering (with Merge it changes nothing).
// On a worker it sends g to the owner; Origin and If are owner only.
func (e *Engine) SetGlobal(g Steering, opts ...WriteOption) (uint64, error) {
	return e.w.setGlobal(g, writeOptsOf(opts))
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
	// Gates are the request's declarative gates (the fork's "steering" field; see Gate),
	// resolved and validated by the owner and stored with the request (Engine.Gates, on either side).
	Gates []Gate
	// Capture is the request's activation capture, {consumer name: that consumer's raw spec}
	// (the fork's "capture" field): each consumer must be declared by the owner
	// (Options.CaptureConsumers), whose validator checks its spec against the model and
	// PromptLen; the validated specs are stored with the request (Engine.Capture).
	Capture map[string]json.RawMessage
	// PromptLen is the request's prompt length in tokens, which the position selectors of
	// its capture resolve against: read only when Capture names a consumer, whose validator
	// checks it (the filesystem consumer: 1..MaxPromptLen).
	PromptLen int
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
	// Replaced: the id was admitted and not ended, and this admission replaced its entry (its
	// steering, gates and capture; a Stepper resets the request's gate state). Re-admitting a
	// live id is allowed: this says it happened.
	Replaced bool
	// Capture is the request's capture as stored: its own specs and the global specs of the
	// declared consumers it does not name (Options.CaptureGlobal). What the owner tells the
	// consumers (capture.Hub.Begin).
	Capture AdmittedCapture
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
	// Columns is the region's column pool (requests admitted at once with their own vectors
	// laid out site by site; RegionConfig), ColumnsUsed the columns taken or retired, and
	// ColumnsRetired those waiting for readers to move on (0 without a pool). A pool that
	// stays full stores new requests' vectors in their entries: steering stays exact, decode
	// steps get slower; raise shm.Config.Columns (serve's columns).
	Columns        uint64 `json:"columns"`
	ColumnsUsed    uint64 `json:"columns_used"`
	ColumnsRetired uint64 `json:"columns_retired"`
	// ColumnsFallbacks counts, since the owner started, the compositions (admissions and their
	// recompositions when a named vector changes) whose vectors went to their entry because
	// the pool was full: each is a request whose decode steps run at the entry layout's
	// speed. It rising means the pool is too small for the requests in flight: raise
	// shm.Config.Columns (serve's --columns). Other processes see the owner's count as of its
	// last admission.
	ColumnsFallbacks uint64 `json:"columns_fallbacks"`
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
	b, _, err := s.View(KindStatus, statusKey)
	if err == nil {
		ls, fallbacks := decodeLatchStats(b)
		st.ColumnsFallbacks = fallbacks
		st.LatchedConversations, st.LatchedBytes = ls.Conversations, ls.Bytes
		st.Evictions, st.OversizeRefusals, st.Triggers, st.Bridges, st.BridgeDrops = ls.Evictions, ls.OversizeRefusals, ls.Triggers, ls.Bridges, ls.BridgeDrops
		st.LatchingOff = ls.Off
	}
	e.w.ownStatus(&st, err == nil) // the owner's own counters
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
	st.Columns, st.ColumnsUsed, st.ColumnsRetired = rs.Columns, rs.ColumnsUsed, rs.ColumnsRetired
	if p := rs.OldestPin; p.Version != 0 {
		st.OldestPin = &PinStatus{Slot: p.Slot, PID: p.PID, Version: p.Version, AgeSeconds: p.Age.Seconds()}
	}
	return st, nil
}

// encodeLatchStats encodes the status entry the owner publishes: the latch counters and
// columnsFallbacks (Status.ColumnsFallbacks).
func encodeLatchStats(s LatchStats, columnsFallbacks uint64) []byte {
	b := make([]byte, 0, 72)
	for _, x := range []uint64{uint64(s.Conversations), uint64(s.Bytes), s.Evictions, s.OversizeRefusals, s.Triggers, s.Bridges, s.BridgeDrops, latchFlags(s), columnsFallbacks} {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return b
}

// decodeLatchStats decodes encodeLatchStats; a shorter entry (before ColumnsFallbacks) reads
// as 0 for the missing words.
func decodeLatchStats(b []byte) (LatchStats, uint64) {
	var x [9]uint64
	for i := range x {
		if len(b) >= 8*(i+1) {
			x[i] = binary.LittleEndian.Uint64(b[8*i:])
		}
	}
	return LatchStats{Conversations: int(x[0]), Bytes: int64(x[1]), Evictions: x[2], OversizeRefusals: x[3], Triggers: x[4], Bridges: x[5], BridgeDrops: x[6], Off: x[7]&1 != 0}, x[8]
}
