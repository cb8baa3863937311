package capture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/shmsteer/shmsteer/steer"
)

const (
	// MaxSlugLen is the longest tag or request id, in characters (the fork's limit).
	MaxSlugLen = 256
	// MaxConsumerName is the longest consumer name in a request's `capture` object.
	MaxConsumerName = 64
	// MaxConsumers bounds the consumers one request names.
	MaxConsumers = 16
	// FilesystemConsumer is the filesystem consumer's name in a request's `capture` object.
	FilesystemConsumer = "filesystem"
)

// DecodeRequest reads a request's `capture` object, {consumer_name: spec}, and returns each
// consumer's spec as raw JSON (for that consumer's decoder, DecodeFilesystemSpec for
// "filesystem"). JSON null or an empty object is no capture (nil). ErrBadSpec if b is not an
// object or a spec is larger than steer.MaxCaptureSpec, ErrBadConsumer for a bad name or more
// than MaxConsumers of them.
func DecodeRequest(b []byte) (map[string]json.RawMessage, error) {
	if isNull(b) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := strictUnmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: capture must be an object {consumer_name: spec}", ErrBadSpec)
	}
	if len(m) > MaxConsumers {
		return nil, fmt.Errorf("%w: %d consumers named, at most %d", ErrBadConsumer, len(m), MaxConsumers)
	}
	for name, spec := range m {
		if err := checkConsumerName(name); err != nil {
			return nil, err
		}
		if len(spec) > steer.MaxCaptureSpec {
			return nil, fmt.Errorf("%w: consumer %q's spec is too large: %d bytes, at most %d; select fewer hooks or positions", ErrBadSpec, name, len(spec), steer.MaxCaptureSpec)
		}
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}

func checkConsumerName(name string) error {
	if name == "" || len(name) > MaxConsumerName {
		return fmt.Errorf("%w: %q is empty or longer than %d bytes", ErrBadConsumer, name, MaxConsumerName)
	}
	for i := 0; i < len(name); i++ {
		if !slugByte(name[i]) {
			return fmt.Errorf("%w: %q has a character outside [a-zA-Z0-9._-]", ErrBadConsumer, name)
		}
	}
	return nil
}

// Layout is the filesystem consumer's on-disk layout.
type Layout string

const (
	// LayoutDefault defers to the consumer's default layout (the spec had no layout or null).
	LayoutDefault Layout = ""
	// LayoutPerFile writes one {layer}_{hook}.bin and .json sidecar per site.
	LayoutPerFile Layout = "per_file"
	// LayoutPacked writes one packed.bin and packed.json index per request.
	LayoutPacked Layout = "packed"
)

// Or is l, or def when l is LayoutDefault.
func (l Layout) Or(def Layout) Layout {
	if l == LayoutDefault {
		return def
	}
	return l
}

// ParseLayout reads a layout name; ErrBadLayout unless per_file or packed (the fork's sharded
// layout is not written here).
func ParseLayout(s string) (Layout, error) {
	switch Layout(s) {
	case LayoutPerFile, LayoutPacked:
		return Layout(s), nil
	}
	return "", fmt.Errorf("%w: %q, want per_file or packed", ErrBadLayout, s)
}

// PositionKind is the form of a position selector (steer's, where the hooks resolve it).
type PositionKind = steer.CapturePosKind

const (
	PosLastPrompt   = steer.CaptureLastPrompt   // the prompt's last token
	PosAllPrompt    = steer.CaptureAllPrompt    // every prompt token
	PosAllGenerated = steer.CaptureAllGenerated // every generated token (positions ≥ the prompt length)
	PosAll          = steer.CaptureAll          // every token
	PosList         = steer.CaptureList         // explicit absolute positions inside the prompt
)

var positionNames = map[string]PositionKind{
	"last_prompt": PosLastPrompt, "all_prompt": PosAllPrompt,
	"all_generated": PosAllGenerated, "all": PosAll,
}

// Positions is a position selector: a kind, and for PosList its positions (sorted and
// deduplicated by Resolve).
type Positions struct {
	Kind PositionKind
	List []int
}

// LayerSelector is one hook's layer selector: "all", a list of layers, or
// {"layers": [...], "ranges": [[a, b], ...]} (ranges inclusive at both ends).
type LayerSelector struct {
	All    bool
	Layers []int
	Ranges [][2]int
}

// FilesystemSpec is the filesystem consumer's per-request spec, the fork's
// FilesystemCaptureRequest, as decoded (not yet validated against a model: see Resolve).
type FilesystemSpec struct {
	RequestID string
	Tag       string
	Hooks     map[string]LayerSelector
	Positions Positions
	Layout    Layout
}

var fsFields = []string{"request_id", "tag", "hooks", "positions", "layout"}

// DecodeFilesystemSpec reads a FilesystemCaptureRequest: request_id, tag, hooks and positions
// required, layout optional (absent or null: the consumer's default). Field names are exact;
// an unknown field, a wrong type, a non-integer layer or position, or trailing bytes are
// ErrBadSpec; an unknown positions string is ErrBadPositions, an empty hooks object or
// positions list ErrEmptySelector, a negative position ErrPositionRange, a bad layout
// ErrBadLayout. The model-dependent checks are Resolve's.
func DecodeFilesystemSpec(b []byte) (FilesystemSpec, error) {
	var s FilesystemSpec
	var m map[string]json.RawMessage
	if err := strictUnmarshal(b, &m); err != nil || m == nil {
		return s, fmt.Errorf("%w: the filesystem spec must be an object with %s", ErrBadSpec, strings.Join(fsFields, ", "))
	}
	for k := range m {
		if !slices.Contains(fsFields, k) {
			return s, fmt.Errorf("%w: unknown field %q in the filesystem spec (fields: %s)", ErrBadSpec, k, strings.Join(fsFields, ", "))
		}
	}
	for _, k := range fsFields[:4] {
		if raw, ok := m[k]; !ok || isNull(raw) {
			return s, fmt.Errorf("%w: the filesystem spec needs %q", ErrBadSpec, k)
		}
	}
	if err := strictUnmarshal(m["request_id"], &s.RequestID); err != nil {
		return s, fmt.Errorf("%w: request_id must be a string", ErrBadSpec)
	}
	if err := strictUnmarshal(m["tag"], &s.Tag); err != nil {
		return s, fmt.Errorf("%w: tag must be a string", ErrBadSpec)
	}
	var hooks map[string]json.RawMessage
	if err := strictUnmarshal(m["hooks"], &hooks); err != nil {
		return s, fmt.Errorf("%w: hooks must be an object {hook: layer selector}", ErrBadSpec)
	}
	if len(hooks) == 0 {
		return s, fmt.Errorf("%w: hooks is empty; name at least one hook", ErrEmptySelector)
	}
	s.Hooks = make(map[string]LayerSelector, len(hooks))
	for name, raw := range hooks {
		sel, err := decodeLayerSelector(raw, fmt.Sprintf("hooks[%q]", name))
		if err != nil {
			return s, err
		}
		s.Hooks[name] = sel
	}
	p, err := decodePositions(m["positions"])
	if err != nil {
		return s, err
	}
	s.Positions = p
	if raw, ok := m["layout"]; ok && !isNull(raw) {
		var l string
		if err := strictUnmarshal(raw, &l); err != nil {
			return s, fmt.Errorf("%w: layout must be a string", ErrBadSpec)
		}
		if s.Layout, err = ParseLayout(l); err != nil {
			return s, err
		}
	}
	return s, nil
}

func decodeLayerSelector(raw json.RawMessage, where string) (LayerSelector, error) {
	var sel LayerSelector
	switch firstByte(raw) {
	case '"':
		var str string
		if err := strictUnmarshal(raw, &str); err != nil || str != "all" {
			return sel, fmt.Errorf("%w: %s: the string form must be \"all\"", ErrBadSpec, where)
		}
		sel.All = true
		return sel, nil
	case '[':
		layers, err := decodeInts(raw, where)
		sel.Layers = layers
		return sel, err
	case '{':
		var m map[string]json.RawMessage
		if err := strictUnmarshal(raw, &m); err != nil {
			return sel, fmt.Errorf("%w: %s must be an object {\"layers\": [...], \"ranges\": [[a, b], ...]}", ErrBadSpec, where)
		}
		for k := range m {
			if k != "layers" && k != "ranges" {
				return sel, fmt.Errorf("%w: %s: unknown key %q (allowed: layers, ranges)", ErrBadSpec, where, k)
			}
		}
		lr, lok := m["layers"]
		rr, rok := m["ranges"]
		lok = lok && !isNull(lr)
		rok = rok && !isNull(rr)
		if !lok && !rok {
			return sel, fmt.Errorf("%w: %s: the object form must set layers and/or ranges", ErrEmptySelector, where)
		}
		if lok {
			if firstByte(lr) != '[' {
				return sel, fmt.Errorf("%w: %s.layers must be a list of ints", ErrBadSpec, where)
			}
			layers, err := decodeInts(lr, where+".layers")
			if err != nil {
				return sel, err
			}
			sel.Layers = layers
		}
		if rok {
			var pairs []json.RawMessage
			if err := strictUnmarshal(rr, &pairs); err != nil || firstByte(rr) != '[' {
				return sel, fmt.Errorf("%w: %s.ranges must be a list of [start, end] pairs", ErrBadSpec, where)
			}
			for i, pr := range pairs {
				w := fmt.Sprintf("%s.ranges[%d]", where, i)
				if firstByte(pr) != '[' {
					return sel, fmt.Errorf("%w: %s must be a [start, end] pair", ErrBadSpec, w)
				}
				ab, err := decodeInts(pr, w)
				if err != nil {
					return sel, err
				}
				if len(ab) != 2 {
					return sel, fmt.Errorf("%w: %s must be a [start, end] pair, has %d elements", ErrBadSpec, w, len(ab))
				}
				sel.Ranges = append(sel.Ranges, [2]int{ab[0], ab[1]})
			}
		}
		return sel, nil
	}
	return sel, fmt.Errorf("%w: %s must be \"all\", a list of layers or {\"layers\": [...], \"ranges\": [[a, b], ...]}", ErrBadSpec, where)
}

func decodePositions(raw json.RawMessage) (Positions, error) {
	var p Positions
	switch firstByte(raw) {
	case '"':
		var str string
		if err := strictUnmarshal(raw, &str); err != nil {
			return p, fmt.Errorf("%w: positions must be a JSON string or a list of ints", ErrBadSpec)
		}
		k, ok := positionNames[str]
		if !ok {
			return p, fmt.Errorf("%w: positions %q, want last_prompt, all_prompt, all_generated, all or a list of ints", ErrBadPositions, str)
		}
		p.Kind = k
		return p, nil
	case '[':
		list, err := decodeInts(raw, "positions")
		if err != nil {
			return p, err
		}
		if len(list) == 0 {
			return p, fmt.Errorf("%w: positions is an empty list", ErrEmptySelector)
		}
		for i, v := range list {
			if v < 0 {
				return p, fmt.Errorf("%w: positions[%d] = %d is negative", ErrPositionRange, i, v)
			}
		}
		p.Kind, p.List = PosList, list
		return p, nil
	}
	return p, fmt.Errorf("%w: positions must be last_prompt, all_prompt, all_generated, all or a list of ints", ErrBadSpec)
}

// decodeInts reads a JSON list of integers (no bools, fractions or exponents).
func decodeInts(raw json.RawMessage, where string) ([]int, error) {
	var elems []json.RawMessage
	if err := strictUnmarshal(raw, &elems); err != nil {
		return nil, fmt.Errorf("%w: %s must be a list of ints", ErrBadSpec, where)
	}
	out := make([]int, 0, len(elems))
	for i, e := range elems {
		var v int
		if c := firstByte(e); (c != '-' && (c < '0' || c > '9')) || bytes.ContainsAny(e, ".eE") {
			return nil, fmt.Errorf("%w: %s[%d] must be an int, got %s", ErrBadSpec, where, i, e)
		}
		if err := json.Unmarshal(e, &v); err != nil {
			return nil, fmt.Errorf("%w: %s[%d] must be an int, got %s", ErrBadSpec, where, i, e)
		}
		out = append(out, v)
	}
	return out, nil
}

// Slug turns a tag or request id into a path segment: ErrBadSlug if it is empty, longer than
// MaxSlugLen characters, contains "..", starts with "/" or is "."; else a name of characters
// in [a-zA-Z0-9._-] is itself (as the fork's) and every other byte becomes %XX (its hex,
// upper case). Unlike the fork's slug ("_" for each such character, so "a/b" and "a_b" named
// one directory), two names never share a slug ("%" is always encoded), and no slug contains
// "@" (the consumer's tenant directories start with it).
func Slug(name string) (string, error) { return slug(name, "name") }

func slug(name, field string) (string, error) {
	n := utf8.RuneCountInString(name)
	switch {
	case n == 0:
		return "", fmt.Errorf("%w: %s is empty", ErrBadSlug, field)
	case n > MaxSlugLen:
		return "", fmt.Errorf("%w: %s has %d characters, at most %d", ErrBadSlug, field, n, MaxSlugLen)
	case strings.Contains(name, ".."):
		return "", fmt.Errorf("%w: %s %q contains \"..\"", ErrBadSlug, field, name)
	case strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("%w: %s %q starts with \"/\"", ErrBadSlug, field, name)
	case name == ".":
		return "", fmt.Errorf("%w: %s \".\" names its parent directory", ErrBadSlug, field)
	}
	seg := escapeSegment(name)
	if len(seg) > maxSegment {
		return "", fmt.Errorf("%w: %s's path segment is %d bytes (each byte outside [a-zA-Z0-9._-] takes 3), at most %d", ErrBadSlug, field, len(seg), maxSegment)
	}
	return seg, nil
}

// maxSegment is the longest path segment (NAME_MAX).
const maxSegment = 255

// isSlug reports whether seg is a Slug's output: escapeSegment of a name Slug accepts.
func isSlug(seg string) bool {
	var name []byte
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		switch {
		case slugByte(c):
			name = append(name, c)
		case c == '%' && i+2 < len(seg) && isUpperHex(seg[i+1]) && isUpperHex(seg[i+2]):
			v, _ := strconv.ParseUint(seg[i+1:i+3], 16, 8)
			if slugByte(byte(v)) {
				return false // not the canonical encoding
			}
			name = append(name, byte(v))
			i += 2
		default:
			return false
		}
	}
	again, err := slug(string(name), "name")
	return err == nil && again == seg
}

func isUpperHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }

// escapeSegment is Slug's encoding: bytes in [a-zA-Z0-9._-] as they are, every other byte as
// %XX (injective: "%" is always encoded).
func escapeSegment(name string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(name))
	for i := 0; i < len(name); i++ {
		if c := name[i]; slugByte(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String()
}

func slugByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// Site is one captured (hook, layer) point.
type Site struct {
	Layer    int
	Hook     steer.HookID
	HookName string
}

// Plan is a validated, resolved filesystem spec: what a worker captures for one request.
type Plan struct {
	RequestID string // the spec's request_id, as the client gave it
	Tag       string
	TagSlug   string // the path segments under the consumer's root
	IDSlug    string
	Sites     []Site // sorted by layer, then hook id; no duplicates
	Positions Positions
	PromptLen int
	Layout    Layout // LayoutDefault: the consumer's default
}

// Resolve validates s against cfg and a prompt of promptLen tokens and resolves it: ErrBadSlug
// for the tag or request id, ErrUnknownHook, ErrLayerRange, ErrEmptySelector for a hook
// selecting no layer, ErrPositionRange for promptLen < 1 or an explicit position outside the
// prompt. s is not changed.
func (s FilesystemSpec) Resolve(cfg steer.ModelConfig, promptLen int) (*Plan, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if promptLen < 1 {
		return nil, fmt.Errorf("%w: prompt length %d, want ≥ 1", ErrPositionRange, promptLen)
	}
	p := &Plan{RequestID: s.RequestID, Tag: s.Tag, PromptLen: promptLen, Layout: s.Layout}
	var err error
	if p.IDSlug, err = slug(s.RequestID, "request_id"); err != nil {
		return nil, err
	}
	if p.TagSlug, err = slug(s.Tag, "tag"); err != nil {
		return nil, err
	}
	if len(s.Hooks) == 0 {
		return nil, fmt.Errorf("%w: hooks is empty; name at least one hook", ErrEmptySelector)
	}
	if p.Layout != LayoutDefault {
		if _, err := ParseLayout(string(p.Layout)); err != nil {
			return nil, err
		}
	}
	for name, sel := range s.Hooks {
		id, err := cfg.Hook(name)
		if err != nil {
			return nil, fmt.Errorf("%w: %q; the model's hooks are %s", ErrUnknownHook, name, strings.Join(hookNames(cfg), ", "))
		}
		layers, err := sel.expand(cfg.Layers, fmt.Sprintf("hooks[%q]", name))
		if err != nil {
			return nil, err
		}
		for _, l := range layers {
			p.Sites = append(p.Sites, Site{Layer: l, Hook: id, HookName: name})
		}
	}
	slices.SortFunc(p.Sites, func(a, b Site) int {
		if a.Layer != b.Layer {
			return a.Layer - b.Layer
		}
		return int(a.Hook) - int(b.Hook)
	})
	p.Positions = Positions{Kind: s.Positions.Kind}
	if s.Positions.Kind == PosList {
		if len(s.Positions.List) == 0 {
			return nil, fmt.Errorf("%w: positions is an empty list", ErrEmptySelector)
		}
		for i, v := range s.Positions.List {
			if v < 0 || v >= promptLen {
				return nil, fmt.Errorf("%w: positions[%d] = %d is outside the prompt [0, %d)", ErrPositionRange, i, v, promptLen)
			}
		}
		p.Positions.List = slices.Compact(slices.Sorted(slices.Values(s.Positions.List)))
	} else if s.Positions.Kind > PosAll {
		return nil, fmt.Errorf("%w: kind %d", ErrBadPositions, s.Positions.Kind)
	}
	return p, nil
}

func hookNames(cfg steer.ModelConfig) []string {
	out := make([]string, cfg.NumHooks())
	for i := range out {
		out[i] = cfg.HookName(steer.HookID(i))
	}
	return out
}

// Expand resolves the selector for a model of layers layers into sorted, distinct layers:
// ErrLayerRange for a layer outside [0, layers) or a range with start > end or outside it,
// ErrEmptySelector if it selects none.
func (sel LayerSelector) Expand(layers int) ([]int, error) { return sel.expand(layers, "selector") }

func (sel LayerSelector) expand(layers int, where string) ([]int, error) {
	if sel.All {
		out := make([]int, layers)
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	in := make([]bool, layers) // a bitmap: many overlapping ranges cost layers, not their sum
	for i, l := range sel.Layers {
		if l < 0 || l >= layers {
			return nil, fmt.Errorf("%w: %s.layers[%d] = %d, the model has layers 0..%d", ErrLayerRange, where, i, l, layers-1)
		}
		in[l] = true
	}
	for i, r := range sel.Ranges {
		if r[0] > r[1] {
			return nil, fmt.Errorf("%w: %s.ranges[%d] = [%d, %d] has start > end", ErrLayerRange, where, i, r[0], r[1])
		}
		if r[0] < 0 || r[1] >= layers {
			return nil, fmt.Errorf("%w: %s.ranges[%d] = [%d, %d], the model has layers 0..%d", ErrLayerRange, where, i, r[0], r[1], layers-1)
		}
	}
	// Fill the ranges merged, so overlapping ranges cost their union, not their sum.
	rs := slices.Clone(sel.Ranges)
	slices.SortFunc(rs, func(a, b [2]int) int { return a[0] - b[0] })
	next := 0 // every layer below next is filled
	for _, r := range rs {
		for l := max(r[0], next); l <= r[1]; l++ {
			in[l] = true
		}
		next = max(next, r[1]+1)
	}
	var out []int
	for l, ok := range in {
		if ok {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s selects no layer", ErrEmptySelector, where)
	}
	return out, nil
}

// Selects reports whether the token at absolute position pos is captured.
func (p *Plan) Selects(pos int) bool {
	sel := p.selector()
	return sel.Selects(pos)
}

// Rows appends to dst the indices (0..n-1) of the rows to copy from a span of n rows whose
// first row is the token at absolute position first, in order, and returns it. The row at
// index i is position first+i. It is steer.CapturePositions.Rows, which the hooks run.
func (p *Plan) Rows(dst []int, first, n int) []int {
	sel := p.selector()
	return sel.Rows(dst, first, n)
}

func (p *Plan) selector() steer.CapturePositions {
	return steer.CapturePositions{Kind: p.Positions.Kind, List: p.Positions.List, PromptLen: p.PromptLen}
}

// Select is what a worker needs of the plan (steer.CaptureSelect): its sites as hook*layers +
// layer, ascending, and its positions.
func (p *Plan) Select(layers int) steer.CaptureSelect {
	sites := make([]int32, 0, len(p.Sites))
	for _, s := range p.Sites {
		sites = append(sites, int32(int(s.Hook)*layers+s.Layer))
	}
	slices.Sort(sites)
	return steer.CaptureSelect{Sites: slices.Compact(sites), Positions: p.selector()}
}

func isNull(b []byte) bool { return string(bytes.TrimSpace(b)) == "null" }

func firstByte(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// strictUnmarshal decodes exactly one JSON value (no trailing bytes).
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing bytes after the JSON value")
	}
	if _, err := dec.Token(); err == nil {
		return fmt.Errorf("trailing bytes after the JSON value")
	}
	return nil
}
