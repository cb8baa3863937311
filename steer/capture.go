package steer

// Activation capture (issue 24), steer's part: a request's capture specs validated at Admit
// and stored with it, the position selectors, and the sink the hooks copy rows into. The
// consumers' spec formats, the ring and the on-disk layout are package capture's (it imports
// steer, so steer knows them only through the validator and the sink it is handed).
//
// The stored entry (KindCapture, key = request id), written in the admission's update and
// removed at End:
//
//	header (16 bytes): "SCAP", u16 format version (1), u16 consumers, u32 prompt length, u32 0
//	per consumer: u16 name length, u8 position kind, u8 0, u32 spec length, u32 sites,
//	              u32 positions; then the name, the spec (raw JSON as admitted), the sites
//	              (u32 each, hook*layers + layer, ascending), the positions (u32 each,
//	              ascending), zero padding to 8
//
// Every length is bounds-checked on decode (FuzzDecodeCaptureEntry).

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// KindCapture holds a request's validated capture specs, key = request id.
const KindCapture shm.Kind = proto.KindCapture

const (
	capMagic   = "SCAP"
	capVersion = 1
	capHdr     = 16
	capConsHdr = 16
	// MaxCaptureConsumers bounds the consumers one request names.
	MaxCaptureConsumers = 16
	// MaxPromptLen bounds Admission.PromptLen (positions are stored as u32).
	MaxPromptLen = math.MaxInt32
	// MaxCaptureSpec bounds one consumer's raw spec, in bytes.
	MaxCaptureSpec = 1 << 20
)

// CapturePosKind is a position selector's form.
type CapturePosKind uint8

const (
	CaptureLastPrompt   CapturePosKind = iota // the prompt's last token
	CaptureAllPrompt                          // every prompt token
	CaptureAllGenerated                       // every generated token (positions ≥ the prompt length)
	CaptureAll                                // every token
	CaptureList                               // explicit absolute positions
)

// CapturePositions selects rows by absolute token position for a prompt of PromptLen tokens.
type CapturePositions struct {
	Kind      CapturePosKind
	List      []int // CaptureList: sorted, distinct, non-negative
	PromptLen int
}

// Selects reports whether the token at absolute position pos is selected.
func (p *CapturePositions) Selects(pos int) bool {
	switch p.Kind {
	case CaptureLastPrompt:
		return pos == p.PromptLen-1
	case CaptureAllPrompt:
		return pos >= 0 && pos < p.PromptLen
	case CaptureAllGenerated:
		return pos >= p.PromptLen
	case CaptureAll:
		return pos >= 0
	case CaptureList:
		_, ok := slices.BinarySearch(p.List, pos)
		return ok
	}
	return false
}

// Rows appends to dst the indices (0..n-1), in order, of the selected rows of a span of n rows
// whose first row is the token at absolute position first (row i is position first+i), and
// returns it. It allocates only when dst must grow.
func (p *CapturePositions) Rows(dst []int, first, n int) []int {
	if n <= 0 {
		return dst
	}
	lo, hi := first, first+n // absolute [lo, hi)
	span := func(a, b int) []int {
		for q := max(a, lo); q < min(b, hi); q++ {
			dst = append(dst, q-first)
		}
		return dst
	}
	switch p.Kind {
	case CaptureLastPrompt:
		return span(p.PromptLen-1, p.PromptLen)
	case CaptureAllPrompt:
		return span(0, p.PromptLen)
	case CaptureAllGenerated:
		return span(p.PromptLen, hi)
	case CaptureAll:
		return span(0, hi)
	case CaptureList:
		i, _ := slices.BinarySearch(p.List, lo)
		for ; i < len(p.List) && p.List[i] < hi; i++ {
			dst = append(dst, p.List[i]-first)
		}
	}
	return dst
}

// CaptureSelect is what a worker needs of one consumer's resolved spec: the sites it captures
// and the positions of each request's rows there.
type CaptureSelect struct {
	Sites     []int32 // hook*layers + layer, ascending, distinct
	Positions CapturePositions
}

// CaptureValidator validates one consumer's raw spec of a request against the model config
// and the prompt length, and resolves it. It returns a typed error for bad input. The owner is
// handed one per declared consumer (Options.CaptureConsumers): package capture builds them
// (capture.Validators), since steer does not know the consumers' spec formats.
type CaptureValidator func(cfg ModelConfig, spec []byte, promptLen int) (CaptureSelect, error)

// CaptureConsumer is one consumer's part of a request's capture, as the owner stored it.
type CaptureConsumer struct {
	Name string
	// Spec is the consumer's spec as admitted (raw JSON; aliases the region when read from a
	// snapshot, valid while it is open).
	Spec []byte
	CaptureSelect
}

// RequestCapture is a request's capture as admitted (Engine.Capture).
type RequestCapture struct {
	PromptLen int
	Consumers []CaptureConsumer // in name order
}

// CaptureGlobalSpec is one declared consumer's global spec (Options.CaptureGlobal): the raw
// spec a request it applies to is captured with, given that request's id (the filesystem
// consumer's fills in the request_id its global spec leaves out). A typed error when the
// spec cannot apply to that id.
type CaptureGlobalSpec func(requestID string) ([]byte, error)

// AdmittedCapture is a request's capture as the owner stored it at Admit (Admitted.Capture).
type AdmittedCapture struct {
	PromptLen int
	// Specs is every consumer's raw spec the request is captured with: its own, and the global
	// ones of the declared consumers it does not name. Nil when it captures nothing.
	Specs map[string]json.RawMessage
	// Global names the consumers of Specs whose spec is their global one.
	Global map[string]bool
	// Skipped are the consumers whose global spec does not apply to this request (its id or
	// prompt length fails the consumer's validator: a request admitted without prompt_len,
	// say), each with the typed error; the request is admitted without them (a global spec is
	// the operator's, so it never refuses a request) and their results say why.
	Skipped map[string]error
}

// globalCheckID is the request id a global spec is validated with at Open.
const globalCheckID = "global-spec-check"

// checkGlobal validates the declared global specs (Open): each names a declared consumer and
// passes its validator as a request's spec would, for the longest prompt (a position list is
// checked against each request's own prompt at Admit).
func (e *Engine) checkGlobal() error { return e.checkGlobalOf(e.opt.CaptureGlobal) }

// SetCaptureGlobal replaces the consumers' global specs (Options.CaptureGlobal), checked as
// Open checks them (a typed error changes nothing), for an owner that starts serving capture
// after Open (the C ABI's shmsteer_capture_global). Requests admitted earlier keep what they
// were admitted with.
func (e *Owner) SetCaptureGlobal(global map[string]CaptureGlobalSpec) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.checkGlobalOf(global); err != nil {
		return err
	}
	e.opt.CaptureGlobal = global
	return nil
}

func (e *Engine) checkGlobalOf(global map[string]CaptureGlobalSpec) error {
	if len(global) == 0 {
		return nil
	}
	if len(global) > MaxCaptureConsumers {
		return fmt.Errorf("%w: %d global specs, at most %d", ErrCaptureConsumer, len(global), MaxCaptureConsumers)
	}
	for n, g := range global {
		v := e.opt.CaptureConsumers[n]
		if v == nil || g == nil {
			return fmt.Errorf("%w: global spec for %q, which is not a declared consumer; the owner declares %s", ErrCaptureConsumer, n, e.declared())
		}
		if _, _, err := e.resolveSpec(n, v, func() ([]byte, error) { return g(globalCheckID) }, MaxPromptLen); err != nil {
			return fmt.Errorf("capture consumer %q's global spec: %w", n, err)
		}
	}
	return nil
}

// resolveSpec runs consumer n's validator on the spec spec gives, for a prompt of promptLen.
func (e *Engine) resolveSpec(n string, v CaptureValidator, spec func() ([]byte, error), promptLen int) ([]byte, CaptureSelect, error) {
	raw, err := spec()
	if err != nil {
		return nil, CaptureSelect{}, err
	}
	if len(n) > math.MaxUint16 {
		return nil, CaptureSelect{}, fmt.Errorf("%w: a consumer name of %d bytes", ErrCaptureConsumer, len(n))
	}
	if len(raw) > MaxCaptureSpec {
		return nil, CaptureSelect{}, fmt.Errorf("%w: consumer %q's spec is %d bytes, at most %d", ErrCaptureSpecTooLarge, n, len(raw), MaxCaptureSpec)
	}
	sel, err := v(e.cfg, raw, promptLen)
	if err != nil {
		return nil, CaptureSelect{}, err
	}
	if promptLen < 0 || promptLen > MaxPromptLen {
		// A validator checks the prompt length; steer's entry stores it in 32 bits.
		return nil, CaptureSelect{}, fmt.Errorf("%w: consumer %q's validator accepted prompt length %d (0..%d)", ErrCaptureConsumer, n, promptLen, MaxPromptLen)
	}
	if err := e.checkSelect(&sel); err != nil {
		return nil, CaptureSelect{}, err
	}
	return raw, sel, nil
}

// admitCapture validates an admission's capture specs with the declared consumers' validators,
// adds the global specs of the consumers it does not name, and encodes the entry (nil when the
// request captures nothing). A bad spec of the request's own refuses it; a global spec that
// does not apply to it is skipped (AdmittedCapture.Skipped).
func (e *Engine) admitCapture(a *Admission) ([]byte, AdmittedCapture, error) {
	ac := AdmittedCapture{PromptLen: a.PromptLen}
	if len(a.Capture) == 0 && len(e.opt.CaptureGlobal) == 0 {
		return nil, ac, nil
	}
	if len(a.Capture) > MaxCaptureConsumers {
		return nil, ac, fmt.Errorf("%w: %d consumers named, at most %d", ErrCaptureConsumer, len(a.Capture), MaxCaptureConsumers)
	}
	names := make([]string, 0, len(a.Capture)+len(e.opt.CaptureGlobal))
	for n := range a.Capture {
		names = append(names, n)
	}
	for n := range e.opt.CaptureGlobal {
		if _, own := a.Capture[n]; !own {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	rc := RequestCapture{PromptLen: a.PromptLen}
	for _, n := range names {
		v := e.opt.CaptureConsumers[n]
		own, isOwn := a.Capture[n]
		if !isOwn {
			g := e.opt.CaptureGlobal[n]
			spec, sel, err := []byte(nil), CaptureSelect{}, error(nil)
			if v == nil { // SetCaptureConsumers dropped its consumer
				err = fmt.Errorf("%w: %q is no longer declared", ErrCaptureConsumer, n)
			} else {
				spec, sel, err = e.resolveSpec(n, v, func() ([]byte, error) { return g(a.RequestID) }, a.PromptLen)
			}
			if err != nil {
				if ac.Skipped == nil {
					ac.Skipped = map[string]error{}
				}
				ac.Skipped[n] = fmt.Errorf("capture consumer %q's global spec does not apply to request %q: %w", n, a.RequestID, err)
				continue
			}
			if ac.Global == nil {
				ac.Global = map[string]bool{}
			}
			ac.Global[n] = true
			rc.Consumers = append(rc.Consumers, CaptureConsumer{Name: n, Spec: spec, CaptureSelect: sel})
			continue
		}
		if v == nil {
			return nil, AdmittedCapture{}, fmt.Errorf("%w: %q; the owner declares %s", ErrCaptureConsumer, n, e.declared())
		}
		spec, sel, err := e.resolveSpec(n, v, func() ([]byte, error) { return own, nil }, a.PromptLen)
		if err != nil {
			return nil, AdmittedCapture{}, fmt.Errorf("capture consumer %q: %w", n, err)
		}
		rc.Consumers = append(rc.Consumers, CaptureConsumer{Name: n, Spec: spec, CaptureSelect: sel})
	}
	if len(rc.Consumers) == 0 {
		return nil, ac, nil
	}
	if len(rc.Consumers) > MaxCaptureConsumers {
		return nil, AdmittedCapture{}, fmt.Errorf("%w: %d consumers with the global specs, at most %d", ErrCaptureConsumer, len(rc.Consumers), MaxCaptureConsumers)
	}
	ac.Specs = make(map[string]json.RawMessage, len(rc.Consumers))
	for _, c := range rc.Consumers {
		ac.Specs[c.Name] = c.Spec
	}
	return encodeCapture(&rc), ac, nil
}

// SetCaptureConsumers replaces the capture consumers the owner declares
// (Options.CaptureConsumers), for an owner that starts serving capture after Open (the C ABI's
// shmsteer_capture_serve). Requests admitted earlier keep what they were admitted with.
func (e *Owner) SetCaptureConsumers(consumers map[string]CaptureValidator) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.opt.CaptureConsumers = consumers
}

// declared names the declared consumers for an error message.
func (e *Engine) declared() string {
	if len(e.opt.CaptureConsumers) == 0 {
		return "none (declare one: serve's --capture-consumer NAME=filesystem, Options.CaptureConsumers)"
	}
	var ns []string
	for n := range e.opt.CaptureConsumers {
		ns = append(ns, fmt.Sprintf("%q", n))
	}
	sort.Strings(ns)
	return fmt.Sprint(ns)
}

// checkSelect checks what a validator resolved (it is the owner's code, but the entry must
// decode in every worker).
func (e *Engine) checkSelect(sel *CaptureSelect) error {
	nsites := e.cfg.NumHooks() * e.cfg.Layers
	if len(sel.Sites) == 0 {
		return fmt.Errorf("%w: the spec selects no site", ErrCaptureConsumer)
	}
	for i, s := range sel.Sites {
		if s < 0 || int(s) >= nsites || i > 0 && s <= sel.Sites[i-1] {
			return fmt.Errorf("%w: the validator resolved site %d (sites must ascend in [0, %d))", ErrLayerRange, s, nsites)
		}
	}
	p := &sel.Positions
	p.PromptLen = max(p.PromptLen, 0)
	if p.Kind > CaptureList {
		return fmt.Errorf("%w: the validator resolved position kind %d", ErrCaptureConsumer, p.Kind)
	}
	if p.Kind != CaptureList {
		p.List = nil
	}
	for i, q := range p.List {
		if q < 0 || q > math.MaxInt32 || i > 0 && q <= p.List[i-1] {
			return fmt.Errorf("%w: the validator resolved position %d (positions must ascend in [0, 2³¹))", ErrCaptureConsumer, q)
		}
	}
	return nil
}

func encodeCapture(rc *RequestCapture) []byte {
	b := make([]byte, capHdr, 256)
	copy(b, capMagic)
	le.PutUint16(b[4:], capVersion)
	le.PutUint16(b[6:], uint16(len(rc.Consumers)))
	le.PutUint32(b[8:], uint32(rc.PromptLen))
	for i := range rc.Consumers {
		c := &rc.Consumers[i]
		var h [capConsHdr]byte
		le.PutUint16(h[0:], uint16(len(c.Name)))
		h[2] = byte(c.Positions.Kind)
		le.PutUint32(h[4:], uint32(len(c.Spec)))
		le.PutUint32(h[8:], uint32(len(c.Sites)))
		le.PutUint32(h[12:], uint32(len(c.Positions.List)))
		b = append(b, h[:]...)
		b = append(b, c.Name...)
		b = append(b, c.Spec...)
		for _, s := range c.Sites {
			b = le.AppendUint32(b, uint32(s))
		}
		for _, q := range c.Positions.List {
			b = le.AppendUint32(b, uint32(q))
		}
		for len(b)%8 != 0 {
			b = append(b, 0)
		}
	}
	return b
}

// decodeCapture reads a KindCapture entry for a model with nsites sites; Spec and Name alias
// b only for Spec (names are copied).
func decodeCapture(b []byte, nsites int) (RequestCapture, error) {
	var rc RequestCapture
	bad := func(format string, a ...any) (RequestCapture, error) {
		return RequestCapture{}, fmt.Errorf("%w: capture entry: %s", ErrBadEncoding, fmt.Sprintf(format, a...))
	}
	if len(b) < capHdr || string(b[:4]) != capMagic {
		return bad("%d bytes, no header", len(b))
	}
	if v := le.Uint16(b[4:]); v != capVersion {
		return bad("format version %d, want %d", v, capVersion)
	}
	n := int(le.Uint16(b[6:]))
	rc.PromptLen = int(le.Uint32(b[8:]))
	if n < 1 || n > MaxCaptureConsumers || rc.PromptLen > MaxPromptLen || le.Uint32(b[12:]) != 0 {
		return bad("%d consumers, prompt length %d", n, rc.PromptLen)
	}
	o := capHdr
	rc.Consumers = make([]CaptureConsumer, 0, n)
	for i := range n {
		if len(b)-o < capConsHdr {
			return bad("consumer %d header past the end", i)
		}
		h := b[o : o+capConsHdr]
		nameLen, kind := int(le.Uint16(h[0:])), CapturePosKind(h[2])
		specLen, ns, np := uint64(le.Uint32(h[4:])), uint64(le.Uint32(h[8:])), uint64(le.Uint32(h[12:]))
		o += capConsHdr
		need := uint64(nameLen) + specLen + 4*ns + 4*np
		if kind > CaptureList || h[3] != 0 || nameLen == 0 || specLen > MaxCaptureSpec || ns < 1 || ns > uint64(nsites) || kind != CaptureList && np != 0 || need > uint64(len(b)-o) {
			return bad("consumer %d: name %d, spec %d bytes, %d sites, %d positions, kind %d in %d bytes", i, nameLen, specLen, ns, np, kind, len(b)-o)
		}
		c := CaptureConsumer{Name: string(b[o : o+nameLen])}
		o += nameLen
		c.Spec = b[o : o+int(specLen) : o+int(specLen)]
		o += int(specLen)
		c.Sites = make([]int32, ns)
		for j := range c.Sites {
			s := le.Uint32(b[o:])
			o += 4
			if s >= uint32(nsites) || j > 0 && int32(s) <= c.Sites[j-1] {
				return bad("consumer %d: site %d", i, s)
			}
			c.Sites[j] = int32(s)
		}
		c.Positions = CapturePositions{Kind: kind, PromptLen: rc.PromptLen}
		if np > 0 {
			c.Positions.List = make([]int, np)
			for j := range c.Positions.List {
				q := int(le.Uint32(b[o:]))
				o += 4
				if q > math.MaxInt32 || j > 0 && q <= c.Positions.List[j-1] {
					return bad("consumer %d: position %d", i, q)
				}
				c.Positions.List[j] = q
			}
		}
		if i > 0 && c.Name <= rc.Consumers[i-1].Name {
			return bad("consumer %q out of order", c.Name)
		}
		for ; o%8 != 0; o++ {
			if o >= len(b) || b[o] != 0 {
				return bad("padding past the end or not zero")
			}
		}
		rc.Consumers = append(rc.Consumers, c)
	}
	if o != len(b) {
		return bad("%d trailing bytes", len(b)-o)
	}
	return rc, nil
}

// Capture reads request requestID's capture as admitted, at snapshot s: its prompt length
// and each consumer's spec (raw JSON as admitted), sites and positions. A request that
// captures nothing (or is not admitted) has no consumers. The one read of the stored specs,
// for workers and consumers alike.
func (e *Engine) Capture(s *shm.Snapshot, requestID string) (RequestCapture, error) {
	b, _, err := s.View(KindCapture, requestID)
	if errors.Is(err, shm.ErrNotFound) {
		return RequestCapture{}, nil
	} else if err != nil {
		return RequestCapture{}, err
	}
	return decodeCapture(b, e.cfg.NumHooks()*e.cfg.Layers)
}

// putCapture stores (enc != nil) or removes a request's capture inside an admission's update.
func putCapture(tx *shm.Tx, requestID string, enc []byte) error {
	if enc != nil {
		return tx.Put(KindCapture, requestID, enc)
	}
	if err := tx.Delete(KindCapture, requestID); err != nil && !errors.Is(err, shm.ErrNotFound) {
		return err
	}
	return nil
}

// CaptureDtype is a captured row's element type; the codes are the capture ring's (and the C
// ABI's SHMSTEER_DTYPE_*).
type CaptureDtype uint8

const (
	CaptureF32  CaptureDtype = 1 // float32
	CaptureBF16 CaptureDtype = 2 // bfloat16, raw little-endian uint16
	CaptureF16  CaptureDtype = 3 // float16
)

// Size is the element size in bytes (0 for an unknown dtype).
func (d CaptureDtype) Size() int {
	switch d {
	case CaptureF32:
		return 4
	case CaptureBF16, CaptureF16:
		return 2
	}
	return 0
}

// String is the dtype's name as the fork's sidecars write it.
func (d CaptureDtype) String() string {
	switch d {
	case CaptureF32:
		return "float32"
	case CaptureBF16:
		return "bfloat16"
	case CaptureF16:
		return "float16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// CaptureRecord is one site's selected rows of one request in one step, as the hooks hand them
// to a CaptureSink: rows Rows[i] of Src (a row-major block of rows of Width elements of Dtype)
// at absolute positions Positions[i]. Every slice is the caller's scratch or hidden state,
// valid only during the call: a sink copies what it keeps.
type CaptureRecord struct {
	RequestID string
	Layer     int
	Hook      string // the hook's name
	Dtype     CaptureDtype
	Width     int
	Positions []int // ascending
	Rows      []int // row index in Src of each position, ascending
	Src       []byte
}

// CaptureSink receives the rows the hooks capture (package capture's RingSink writes them into
// the worker's capture ring). Capture is called from the stepping goroutine, once per (site,
// request) with rows in a step; it must not keep rec or its slices. An error (a full ring that
// dropped the record, say) is counted in StepStats.CaptureErrors and never fails the step.
type CaptureSink interface {
	Capture(rec *CaptureRecord) error
}

// CaptureFlusher is a CaptureSink that holds the records it is handed until Flush: the hooks
// call Flush after each site's records (package capture's RingSink publishes them then, with
// one store).
type CaptureFlusher interface {
	CaptureSink
	Flush()
}

// CaptureOptions say whether and where a Stepper (and its Batch) captures.
type CaptureOptions struct {
	// Sink receives the captured rows; nil turns capture off.
	Sink CaptureSink
	// Rank is this process's tensor-parallel rank and WriterRank the one rank that writes
	// (default 0): the post-all-reduce residual is the same on every rank, so the others
	// capture nothing (and read no capture entries).
	Rank, WriterRank int
}
