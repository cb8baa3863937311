package serve

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/shmsteer/shmsteer/capture"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shmsteer/shmsteer/mirror"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

var (
	// ErrNotImplemented means a fork feature serve does not have (SAE modules).
	ErrNotImplemented = errors.New("shmsteer: not implemented by shmsteer serve")
	// ErrNotFound means the named vector, module or conversation does not exist.
	ErrNotFound = errors.New("shmsteer: not found")
	// ErrNotPersisted means a change is live but could not be written to the state directory;
	// serve retries in the background: check the disk and the logs.
	ErrNotPersisted = errors.New("shmsteer: change applied but not persisted")
)

type apiError struct {
	err    error
	status int
	typ    string
}

// apiErrors maps sentinels to an HTTP status and the error "type" in replies; first match wins
// (vecfileErrors are tried first).
var apiErrors = []apiError{
	{ErrUnauthorized, http.StatusUnauthorized, "unauthorized"},
	{ErrForbidden, http.StatusForbidden, "forbidden"},
	{ErrNotFound, http.StatusNotFound, "not_found"},
	{ErrNotImplemented, http.StatusNotImplemented, "not_implemented"},
	{ErrNotPersisted, http.StatusInternalServerError, "not_persisted"},
	{ErrBusy, http.StatusServiceUnavailable, "busy"},
	{ErrQuota, http.StatusTooManyRequests, "quota"},
	{ErrBadInput, http.StatusBadRequest, "bad_request"},
	{steer.ErrBadName, http.StatusBadRequest, "bad_name"},
	{steer.ErrNonFinite, http.StatusBadRequest, "non_finite"},
	{steer.ErrHiddenSize, http.StatusBadRequest, "hidden_size"},
	{steer.ErrUnknownHook, http.StatusBadRequest, "unknown_hook"},
	{steer.ErrLayerRange, http.StatusBadRequest, "layer_range"},
	{steer.ErrDuplicate, http.StatusBadRequest, "duplicate"},
	{steer.ErrEmptySet, http.StatusBadRequest, "empty_set"},
	{steer.ErrBadClamp, http.StatusBadRequest, "bad_clamp"},
	{steer.ErrUnknownVector, http.StatusBadRequest, "unknown_vector"},
	{steer.ErrBadRequestID, http.StatusBadRequest, "bad_request_id"},
	{steer.ErrBadEncoding, http.StatusBadRequest, "bad_encoding"},
	{steer.ErrOverflow, http.StatusBadRequest, "overflow"},
	{steer.ErrProbeSite, http.StatusBadRequest, "probe_site"},
	{steer.ErrBadModelHint, http.StatusBadRequest, "bad_model_hint"},
	{steer.ErrBadGate, http.StatusBadRequest, "bad_gate"},
	{steer.ErrGateUnsupported, http.StatusBadRequest, "gate_unsupported"},
	{steer.ErrCaptureConsumer, http.StatusBadRequest, "capture_consumer"},
	{steer.ErrCaptureSpecTooLarge, http.StatusBadRequest, "capture_spec"},
	{capture.ErrBadSpec, http.StatusBadRequest, "capture_spec"},
	{capture.ErrBadConsumer, http.StatusBadRequest, "capture_consumer"},
	{capture.ErrBadSlug, http.StatusBadRequest, "capture_spec"},
	{capture.ErrUnknownHook, http.StatusBadRequest, "unknown_hook"},
	{capture.ErrLayerRange, http.StatusBadRequest, "layer_range"},
	{capture.ErrEmptySelector, http.StatusBadRequest, "capture_spec"},
	{capture.ErrBadPositions, http.StatusBadRequest, "capture_spec"},
	{capture.ErrPositionRange, http.StatusBadRequest, "capture_spec"},
	{capture.ErrBadLayout, http.StatusBadRequest, "capture_spec"},
	{shm.ErrValueTooLarge, http.StatusRequestEntityTooLarge, "too_large"},
	{shm.ErrKeyTooLong, http.StatusBadRequest, "bad_name"},
	{shm.ErrRegionFull, http.StatusInsufficientStorage, "region_full"},
}

type errorBody struct {
	Error string `json:"error"`
	Type  string `json:"type"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	code, typ := http.StatusInternalServerError, "internal"
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		code, typ = http.StatusRequestEntityTooLarge, "too_large"
	} else {
		for _, e := range slices.Concat(vecfileErrors, apiErrors) {
			if errors.Is(err, e.err) {
				code, typ = e.status, e.typ
				break
			}
		}
	}
	var wf withFields
	if errors.As(err, &wf) {
		out := map[string]any{"error": err.Error(), "type": typ}
		for k, v := range wf.fields {
			out[k] = v
		}
		writeJSON(w, code, out)
		return
	}
	if errors.Is(err, ErrBusy) {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, code, errorBody{Error: err.Error(), Type: typ})
}

type apiFunc func(r *http.Request, p principal, body []byte) (any, error)

// api wraps a /v1/ handler: authentication, the body cap, timing, JSON replies.
func (s *Server) api(route string, h apiFunc) http.HandlerFunc {
	return s.apiStream(route, func(w http.ResponseWriter, r *http.Request, p principal) (any, error) {
		body, release, err := s.readBody(w, r, p)
		defer release()
		if err != nil {
			return nil, err
		}
		return h(r, p, body)
	})
}

// streamFunc handles a /v1/ call that reads the body itself or writes a reply other than
// JSON; it returns (nil, nil) when it has written the reply.
type streamFunc func(w http.ResponseWriter, r *http.Request, p principal) (any, error)

// apiStream wraps a /v1/ handler: authentication, timing, JSON replies and errors.
func (s *Server) apiStream(route string, h streamFunc) http.HandlerFunc {
	return s.met.timeHTTP(route, func(w http.ResponseWriter, r *http.Request) {
		p, err := s.authorize(r, route)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="shmsteer"`)
			writeError(w, err)
			return
		}
		out, err := h(w, r, p)
		if err != nil {
			writeError(w, err)
			return
		}
		if out != nil {
			writeJSON(w, http.StatusOK, out)
		}
	})
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.met.timeHTTP("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}))
	mux.HandleFunc("GET /readyz", s.met.timeHTTP("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}))
	mux.Handle("GET /metrics", s.met.handler())
	for _, rt := range []struct {
		pattern string
		h       apiFunc
	}{
		{"POST /v1/steering/set", s.setGlobal},
		{"POST /v1/steering/clear", s.clearGlobal},
		{"GET /v1/steering", s.getSteering},
		{"GET /v1/steering/layers", s.getLayers},
		{"POST /v1/steering/vectors/register", s.registerVector},
		{"POST /v1/steering/vectors/unregister", s.unregisterVector},
		{"GET /v1/steering/vectors", s.listVectors},
		{"POST /v1/steering/modules/register", s.registerModule},
		{"POST /v1/steering/modules/unregister", s.unregisterModule},
		{"GET /v1/steering/modules", s.listModules},
		{"GET /v1/steering/dynamic", s.dynamic},
		{"POST /v1/requests/admit", s.admit},
		{"POST /v1/requests/end", s.end},
		{"GET /v1/requests/{id}/capture", s.captureResult},
		{"DELETE /v1/conversations/{tenant}/{id}", s.dropConversation},
		{"GET /v1/status", func(_ *http.Request, p principal, _ []byte) (any, error) { return s.statusFor(p) }},
	} {
		route := rt.pattern[strings.IndexByte(rt.pattern, ' ')+1:]
		mux.HandleFunc(rt.pattern, s.api(route, rt.h))
	}
	mux.HandleFunc("POST /v1/steering/vectors/import", s.apiStream("/v1/steering/vectors/import", s.importVector))
	mux.HandleFunc("GET /v1/steering/vectors/{rest...}", s.apiStream("/v1/steering/vectors/{name}/export", s.exportVector))
	mux.HandleFunc("/v1/", s.api("other", func(*http.Request, principal, []byte) (any, error) {
		return nil, fmt.Errorf("%w: no such endpoint or method", ErrNotFound)
	}))
	return mux
}

func needAdmin(p principal, what string) error {
	if !p.admin() {
		return fmt.Errorf("%w: %s needs an unscoped API key (this key belongs to tenant %q)", ErrForbidden, what, p.tenant)
	}
	return nil
}

// persistAfterChange persists after a mutation (callers hold s.mu).
func (s *Server) persistAfterChange() error {
	if err := s.persistLocked(); err != nil {
		s.log.Error("persisting state failed; will retry", "err", err)
		return fmt.Errorf("%w: %w", ErrNotPersisted, err)
	}
	return nil
}

// --- global steering ---

// noVectorsText is the fork's refusal of a /set with nothing in it. Its router says "No vectors
// or clamps provided"; its older tests look for "No vectors provided": the message holds both.
const noVectorsText = "No vectors or clamps provided (No vectors provided): include at least one of vectors, prefill_vectors, decode_vectors, clamps, prefill_clamps, decode_clamps (or the *_vector_refs) with hook point/layer data"

func (s *Server) setGlobal(_ *http.Request, p principal, body []byte) (any, error) {
	if err := needAdmin(p, "global steering"); err != nil {
		return nil, err
	}
	var req SetRequest
	if err := decodePayload(body, &req); err != nil {
		return nil, err
	}
	st, err := req.Steering(s.eng.Config())
	if err != nil {
		return nil, err
	}
	if st.Empty() {
		return nil, badInput("%s", noVectorsText)
	}
	if err := checkSites(&st, s.eng.Config(), styleSet, ""); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.eng.SetGlobal(st, mergeUnless(req.Replace)...)
	if err != nil {
		return nil, err
	}
	hooks, layers := sites(&st)
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	return map[string]any{"status": "ok", "hook_points": hooks, "layers_updated": layers, "version": v}, nil
}

type site struct {
	hook  string
	layer int
}

// mergeUnless is SetGlobal's options for the API's and the CLI's replace flag: merge per site
// (steer.MergeSites, in the owner under its write lock) unless replace.
func mergeUnless(replace bool) []steer.WriteOption {
	if replace {
		return nil
	}
	return []steer.WriteOption{steer.Merge()}
}

func sites(st *steer.Steering) (hooks []string, layers []int) {
	hooks, layers = []string{}, []int{} // a set of references only answers empty lists, not null
	for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
		t := st.Tier(ph)
		for _, v := range t.Vectors {
			hooks, layers = append(hooks, v.Hook), append(layers, v.Layer)
		}
		for _, c := range t.Clamps {
			hooks, layers = append(hooks, c.Hook), append(layers, c.Layer)
		}
	}
	slices.Sort(hooks)
	slices.Sort(layers)
	return slices.Compact(hooks), slices.Compact(layers)
}

func (s *Server) clearGlobal(_ *http.Request, p principal, body []byte) (any, error) {
	if err := needAdmin(p, "global steering"); err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(body)) > 0 {
		var req struct{} // the fork's /clear takes no body; an empty object is accepted
		if err := decodeStrict(body, &req); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.eng.SetGlobal(steer.Steering{})
	if err != nil {
		return nil, err
	}
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	return map[string]any{"status": "ok", "version": v}, nil
}

// HookNorms is what GET /v1/steering reports per (layer, hook), as the fork's workers do: the
// L2 norm of each tier's summed vector (named references resolved), rounded to 6 decimals,
// under "norm" (base), "prefill_norm" and "decode_norm"; zero norms are left out.
type HookNorms map[string]float64

func (s *Server) getSteering(*http.Request, principal, []byte) (any, error) {
	active, clamps, v, err := ActiveLayers(s.eng.Engine)
	if err != nil {
		return nil, err
	}
	return map[string]any{"active_layers": active, "clamps": clamps, "version": v}, nil
}

// ActiveLayers summarizes the global steering: layer → hook → norms (non-zero only), and
// layer → hook → number of clamps (sites with clamps only).
func ActiveLayers(eng *steer.Engine) (map[string]map[string]HookNorms, map[string]map[string]int, uint64, error) {
	snap, err := eng.Region().Snapshot()
	if err != nil {
		return nil, nil, 0, err
	}
	defer snap.Close()
	out := map[string]map[string]HookNorms{}
	clamps := map[string]map[string]int{}
	g, _, ok, err := eng.Global(&snap)
	if err != nil || !ok {
		return out, clamps, snap.Version(), err
	}
	hidden := eng.Config().Hidden
	type key struct {
		ph steer.Phase
		site
	}
	sums := map[key][]float64{}
	add := func(k key, scale float32, d []float32) {
		acc := sums[k]
		if acc == nil {
			acc = make([]float64, hidden)
			sums[k] = acc
		}
		for i, f := range d {
			acc[i] += float64(scale) * float64(f)
		}
	}
	for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
		t := g.Tier(ph)
		for _, v := range t.Vectors {
			add(key{ph, site{v.Hook, v.Layer}}, v.Scale, v.Data)
		}
		for _, ref := range t.Refs {
			nv, err := eng.Vector(&snap, ref.Name)
			if err != nil {
				continue // unregistered since: it no longer applies
			}
			for _, v := range nv.Vectors {
				add(key{ph, site{v.Hook, v.Layer}}, ref.Strength*v.Scale, v.Data)
			}
		}
		for _, c := range t.Clamps {
			l := strconv.Itoa(c.Layer)
			if clamps[l] == nil {
				clamps[l] = map[string]int{}
			}
			clamps[l][c.Hook]++
		}
	}
	normKey := map[steer.Phase]string{steer.PhaseBase: "norm", steer.PhasePrefill: "prefill_norm", steer.PhaseDecode: "decode_norm"}
	for k, acc := range sums {
		var ss float64
		for _, f := range acc {
			ss += f * f
		}
		n := math.Round(math.Sqrt(ss)*1e6) / 1e6
		if !(n > 0) {
			continue
		}
		l := strconv.Itoa(k.layer)
		if out[l] == nil {
			out[l] = map[string]HookNorms{}
		}
		if out[l][k.hook] == nil {
			out[l][k.hook] = HookNorms{}
		}
		out[l][k.hook][normKey[k.ph]] = n
	}
	return out, clamps, snap.Version(), nil
}

// getLayers answers the fork's flat {"layers": {layer: {"hook_points": [sorted hooks]}}}:
// every layer of the model has every hook.
func (s *Server) getLayers(*http.Request, principal, []byte) (any, error) {
	cfg := s.eng.Config()
	hooks := make([]string, cfg.NumHooks())
	for i := range hooks {
		hooks[i] = cfg.HookName(steer.HookID(i))
	}
	sort.Strings(hooks)
	flat := map[string]any{}
	for l := range cfg.Layers {
		flat[strconv.Itoa(l)] = map[string]any{"hook_points": hooks}
	}
	return map[string]any{"layers": flat}, nil
}

// --- named vectors ---

// VectorSummary is one named vector in listings ("details" of GET /v1/steering/vectors).
type VectorSummary struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
	Entries int    `json:"entries"`
	// ModelHint is a steering vector's model hint (a GGUF's controlvector.model_hint kept
	// with it; absent when it has none).
	ModelHint string `json:"model_hint,omitempty"`
}

// ListVectors lists the named vectors (steer, then probe, each by name) a principal may see.
func ListVectors(eng *steer.Engine, visible func(string) bool) ([]VectorSummary, error) {
	snap, err := eng.Region().Snapshot()
	if err != nil {
		return nil, err
	}
	defer snap.Close()
	out := []VectorSummary{}
	for _, kind := range []steer.VectorKind{steer.VectorSteer, steer.VectorProbe} {
		infos, read := eng.VectorInfos, eng.Vector
		if kind == steer.VectorProbe {
			infos, read = eng.ProbeInfos, eng.Probe
		}
		list, err := infos(&snap)
		if err != nil {
			return nil, err
		}
		var part []VectorSummary
		for _, in := range list {
			if !visible(in.Name) {
				continue
			}
			vs := VectorSummary{Name: in.Name, Kind: kind.String(), Version: in.Version, Digest: hex.EncodeToString(in.Digest[:]), ModelHint: in.ModelHint}
			if nv, err := read(&snap, in.Name); err == nil {
				vs.Entries = len(nv.Vectors)
			}
			part = append(part, vs)
		}
		sort.Slice(part, func(i, j int) bool { return part[i].Name < part[j].Name })
		out = append(out, part...)
	}
	return out, nil
}

// vectorsByKind is the fork's listing: {"probe": [names], "steer": [names]}, sorted.
func vectorsByKind(list []VectorSummary) map[string][]string {
	out := map[string][]string{"probe": {}, "steer": {}}
	for _, v := range list {
		out[v.Kind] = append(out[v.Kind], v.Name)
	}
	return out
}

// vectorKind reads the required kind of a vectors/register or /unregister body.
func vectorKind(kind *string) (steer.VectorKind, error) {
	if kind == nil {
		return 0, badInput("kind is required: \"steer\" or \"probe\"")
	}
	k, ok := steer.ParseVectorKind(*kind)
	if !ok {
		return 0, badInput("kind must be one of ('probe', 'steer'), got %s", pyStr(*kind))
	}
	return k, nil
}

// withFields adds fields to the JSON error reply of err (the fork's 404 carries "vectors").
type withFields struct {
	error
	fields map[string]any
}

func (e withFields) Unwrap() error { return e.error }

func (s *Server) registerVector(_ *http.Request, p principal, body []byte) (any, error) {
	var req struct {
		Name   string                     `json:"name"`
		Kind   *string                    `json:"kind"`
		Packed map[string]json.RawMessage `json:"packed"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	kind, err := vectorKind(req.Kind)
	if err != nil {
		return nil, err
	}
	if req.Name == "" {
		return nil, fmt.Errorf("%w: vector name must be non-empty", steer.ErrBadName)
	}
	if !p.owns(req.Name) {
		return nil, fmt.Errorf("%w: tenant %q may register only names starting with %q", ErrForbidden, p.tenant, p.tenant+"/")
	}
	if len(req.Packed) == 0 {
		return nil, badInput("%s vector %s must be a non-empty packed dict", kind, pyStr(req.Name))
	}
	var vecs []steer.Vector
	for _, h := range sortedKeys(req.Packed) {
		var pk Packed
		d := json.NewDecoder(bytes.NewReader(req.Packed[h]))
		d.DisallowUnknownFields()
		if err := d.Decode(&pk); err != nil {
			return nil, malformed("packed["+pyStr(h)+"]", "%s", describeJSONError(err))
		}
		vs, err := packedVectors(&pk, h)
		if err != nil {
			return nil, fmt.Errorf("packed[%s]: %w", pyStr(h), err)
		}
		vecs = append(vecs, vs...)
	}
	st := steer.Steering{Base: steer.Tier{Vectors: vecs}}
	if err := checkSites(&st, s.eng.Config(), styleVector, req.Name); err != nil {
		return nil, err
	}
	if kind == steer.VectorProbe && len(vecs) != 1 {
		return nil, fmt.Errorf("%w: probe vector %s must name exactly one (hook, layer); got %d rows", steer.ErrProbeSite, pyStr(req.Name), len(vecs))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkVectorQuota(p, kind, req.Name, vecs); err != nil {
		return nil, err
	}
	reg := s.eng.Register
	if kind == steer.VectorProbe {
		reg = s.eng.RegisterProbe
	}
	info, err := reg(req.Name, vecs)
	if err != nil {
		return nil, err
	}
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	list, err := ListVectors(s.eng.Engine, p.owns)
	return map[string]any{"status": "ok", "name": req.Name, "kind": kind.String(), "version": info.Version,
		"digest": hex.EncodeToString(info.Digest[:]), "vectors": vectorsByKind(list)}, err
}

func (s *Server) unregisterVector(_ *http.Request, p principal, body []byte) (any, error) {
	var req struct {
		Name string  `json:"name"`
		Kind *string `json:"kind"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	kind, err := vectorKind(req.Kind)
	if err != nil {
		return nil, err
	}
	if !p.owns(req.Name) {
		return nil, fmt.Errorf("%w: tenant %q may remove only names starting with %q", ErrForbidden, p.tenant, p.tenant+"/")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var v uint64
	var dropped []string
	if kind == steer.VectorProbe {
		v, err = s.eng.UnregisterProbe(req.Name) // no steering set can reference a probe
	} else {
		v, dropped, err = UnregisterVector(s.eng.Engine, req.Name)
	}
	if errors.Is(err, steer.ErrUnknownVector) || errors.Is(err, steer.ErrBadName) {
		list, lerr := ListVectors(s.eng.Engine, p.owns)
		if lerr != nil {
			return nil, lerr
		}
		return nil, withFields{fmt.Errorf("%w: %s vector %s not found", ErrNotFound, kind, pyStr(req.Name)), map[string]any{"vectors": vectorsByKind(list)}}
	} else if err != nil {
		return nil, err
	}
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	list, err := ListVectors(s.eng.Engine, p.owns)
	if dropped == nil {
		dropped = []string{}
	}
	return map[string]any{"status": "ok", "name": req.Name, "kind": kind.String(), "version": v, "vectors": vectorsByKind(list),
		"dropped_references": dropped}, err
}

// listVectors answers the fork's exact {vectors, count}; ?details=1 adds serve's details.
func (s *Server) listVectors(r *http.Request, p principal, _ []byte) (any, error) {
	list, err := ListVectors(s.eng.Engine, p.owns)
	out := map[string]any{"vectors": vectorsByKind(list), "count": len(list)}
	if d := r.URL.Query().Get("details"); d != "" && d != "0" && d != "false" {
		out["details"] = list
	}
	return out, err
}

// --- modules ---

type moduleRequest struct {
	Name           string     `json:"name"`
	Kind           *string    `json:"kind"`
	Vectors        VectorSpec `json:"vectors,omitempty"`
	PrefillVectors VectorSpec `json:"prefill_vectors,omitempty"`
	DecodeVectors  VectorSpec `json:"decode_vectors,omitempty"`
	Clamps         ClampSpec  `json:"clamps,omitempty"`
	PrefillClamps  ClampSpec  `json:"prefill_clamps,omitempty"`
	DecodeClamps   ClampSpec  `json:"decode_clamps,omitempty"`
	SAEManifest    any        `json:"sae_manifest,omitempty"`
}

func (s *Server) moduleNames(p principal) []string {
	out := []string{}
	for n := range s.modules {
		if p.owns(n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func checkModuleKind(kind *string) error {
	if kind == nil || *kind == "additive" {
		return nil
	}
	if *kind == "sae_delta" {
		return fmt.Errorf("%w: kind \"sae_delta\"", ErrNotImplemented)
	}
	return badInput("kind %q: want \"additive\"", *kind)
}

func (s *Server) registerModule(_ *http.Request, p principal, body []byte) (any, error) {
	var req moduleRequest
	if err := decodePayload(body, &req); err != nil {
		return nil, err
	}
	if err := checkModuleKind(req.Kind); err != nil {
		return nil, err
	}
	if req.SAEManifest != nil {
		return nil, badInput("sae_manifest is for kind \"sae_delta\"")
	}
	if len(req.Name) == 0 || len(req.Name) > steer.MaxNameLen {
		return nil, fmt.Errorf("%w (%d bytes)", steer.ErrBadName, len(req.Name))
	}
	if !p.owns(req.Name) {
		return nil, fmt.Errorf("%w: tenant %q may register only modules named %q+NAME", ErrForbidden, p.tenant, p.tenant+"/")
	}
	sr := SetRequest{Vectors: req.Vectors, PrefillVectors: req.PrefillVectors, DecodeVectors: req.DecodeVectors,
		Clamps: req.Clamps, PrefillClamps: req.PrefillClamps, DecodeClamps: req.DecodeClamps}
	st, err := sr.Steering(s.eng.Config())
	if err != nil {
		return nil, err
	}
	if st.Empty() {
		return nil, badInput("Steering module %s has no vectors in any tier (and no clamps)", pyStr(req.Name))
	}
	if err := checkSites(&st, s.eng.Config(), styleModule, req.Name); err != nil {
		return nil, err
	}
	wire, d, err := steer.EncodeSteering(&st, s.eng.Config())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.modules[req.Name] = module{wire: wire, digest: d}
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	return map[string]any{"status": "ok", "name": req.Name, "digest": hex.EncodeToString(d[:]), "modules": s.moduleNames(p)}, nil
}

func (s *Server) unregisterModule(_ *http.Request, p principal, body []byte) (any, error) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.modules[req.Name]; !ok || !p.owns(req.Name) {
		avail := "none"
		if names := s.moduleNames(p); len(names) > 0 {
			avail = pyList(names)
		}
		return nil, fmt.Errorf("%w: Steering module %s not found. Available: %s", ErrNotFound, pyStr(req.Name), avail)
	}
	delete(s.modules, req.Name)
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	return map[string]any{"status": "ok", "name": req.Name, "modules": s.moduleNames(p)}, nil
}

func (s *Server) listModules(_ *http.Request, p principal, _ []byte) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := s.moduleNames(p)
	return map[string]any{"modules": names, "count": len(names)}, nil
}

// --- latches, admissions ---

// dynamic answers the fork's {workers, determinism}: one entry per worker that reports its
// step checksum (ReportChecksum), with the fork's action_checksum/action_count keys
// (action_count is the worker's step), and determinism {"consistent": true, "action_count":
// N} or {"consistent": false, "checksums": {worker: checksum}} over the workers at the newest
// step. serve's latch counters are under "latches".
func (s *Server) dynamic(*http.Request, principal, []byte) (any, error) {
	st, err := s.eng.Status()
	if err != nil {
		return nil, err
	}
	reports, agree := s.checks.report()
	workers := make([]map[string]any, len(reports))
	sums := map[string]string{}
	var top uint64
	for i, r := range reports {
		workers[i] = map[string]any{"worker": r.Worker, "step": r.Step, "checksum": r.Checksum, "age_seconds": r.AgeSeconds,
			"action_checksum": r.Checksum, "action_count": r.Step, "steering_initialized": true}
		sums[r.Worker] = r.Checksum
		top = max(top, r.Step)
	}
	gates, err := s.gateCounts()
	if err != nil {
		return nil, err
	}
	determinism := map[string]any{"consistent": true, "action_count": top}
	if agree != nil && !*agree {
		determinism = map[string]any{"consistent": false, "checksums": sums}
	}
	return map[string]any{
		"workers": workers, "determinism": determinism, "gates": gates, "gate_work": s.gwork.snapshot(),
		"latches": map[string]any{
			"latched_conversations": st.LatchedConversations, "latched_bytes": st.LatchedBytes,
			"evictions": st.Evictions, "oversize_refusals": st.OversizeRefusals, "triggers": st.Triggers,
			"bridges": st.Bridges, "bridge_drops": st.BridgeDrops,
			"max_conversations": s.cfg.MaxConversations, "max_latched_bytes": s.cfg.MaxLatchedBytes,
			"policy": strings.ToLower(s.cfg.LatchPolicy), "requests_with_steering": st.RequestsWithSteering,
			"latch_state_hash": fmt.Sprintf("%016x", s.eng.Latches().StateHash()),
		},
	}, nil
}

// AdmitRequest is the body of POST /v1/requests/admit.
type AdmitRequest struct {
	RequestID    string      `json:"request_id"`
	Tenant       string      `json:"tenant,omitempty"`
	Conversation string      `json:"conversation,omitempty"`
	Module       string      `json:"module,omitempty"`
	Override     *SetRequest `json:"override,omitempty"`
	Compose      string      `json:"compose,omitempty"` // "replace" (default) or "add"
	// Steering is the fork's declarative gates: [{when, scope, apply}, ...] (steer.DecodeGates).
	Steering json.RawMessage `json:"steering,omitempty"`
	// Capture is the request's activation capture, {consumer: spec} (capture.DecodeRequest),
	// naming consumers declared with --capture-consumer; PromptLen is the prompt's length in
	// tokens, which its position selectors resolve against.
	Capture   json.RawMessage `json:"capture,omitempty"`
	PromptLen int             `json:"prompt_len,omitempty"`
}

var sourceNames = []string{"none", "override", "latch", "composed"}

func (s *Server) admit(_ *http.Request, p principal, body []byte) (any, error) {
	var req AdmitRequest
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	if !p.admin() {
		if req.Tenant == "" {
			req.Tenant = p.tenant
		}
		if req.Tenant != p.tenant || !p.owns(req.RequestID) {
			return nil, fmt.Errorf("%w: tenant %q may admit only its own conversations, with request ids starting with %q", ErrForbidden, p.tenant, p.tenant+"/")
		}
	}
	a := steer.Admission{RequestID: req.RequestID, Conversation: steer.ConvKey{Tenant: req.Tenant, ID: req.Conversation}}
	var ov steer.Steering
	if req.Module != "" {
		if !p.owns(req.Module) {
			return nil, fmt.Errorf("%w: module %q", ErrForbidden, req.Module)
		}
		s.mu.Lock()
		m, ok := s.modules[req.Module]
		s.mu.Unlock()
		if !ok {
			avail := "none"
			s.mu.Lock()
			if names := s.moduleNames(p); len(names) > 0 {
				avail = pyList(names)
			}
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: Unknown steering module %s. Available: %s", ErrNotFound, pyStr(req.Module), avail)
		}
		st, _, err := steer.DecodeSteering(m.wire, s.eng.Config())
		if err != nil {
			return nil, err
		}
		ov = st.Clone()
	}
	if req.Override != nil {
		if req.Override.Replace {
			return nil, badInput("override takes no replace")
		}
		st, err := req.Override.Steering(s.eng.Config())
		if err != nil {
			return nil, err
		}
		if err := checkSites(&st, s.eng.Config(), styleSet, ""); err != nil {
			return nil, err
		}
		for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
			for _, r := range st.Tier(ph).Refs {
				if !p.owns(r.Name) {
					return nil, fmt.Errorf("%w: named vector %q", ErrForbidden, r.Name)
				}
			}
		}
		ov = addSteering(ov, st)
	}
	switch req.Compose {
	case "", "replace":
	case "add":
		ov.Compose = steer.ComposeAdd
	default:
		return nil, badInput("compose %q: want replace or add", req.Compose)
	}
	if !ov.Empty() {
		a.Override = &ov
	}
	gates, err := parseGates(req.Steering, p)
	if err != nil {
		return nil, err
	}
	a.Gates = gates
	if len(req.Capture) > 0 {
		if a.Capture, err = capture.DecodeRequest(req.Capture); err != nil {
			return nil, err
		}
	}
	if req.PromptLen < 0 {
		return nil, badInput("prompt_len %d is negative", req.PromptLen)
	}
	a.PromptLen = req.PromptLen
	out, err := s.admitCounted(p, a)
	if err != nil {
		return nil, err
	}
	s.warnColumnsFull(time.Now())
	s.captureBegin(a.RequestID, out.Capture)
	s.dirty.Store(true)
	return map[string]any{"version": out.Version, "source": sourceNames[out.Source], "latched": out.Latched,
		"refused": out.Refused, "digest": hex.EncodeToString(out.Digest[:])}, nil
}

func (s *Server) end(_ *http.Request, p principal, body []byte) (any, error) {
	var req struct {
		RequestID string `json:"request_id"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	if !p.owns(req.RequestID) {
		return nil, fmt.Errorf("%w: tenant %q may end only request ids starting with %q", ErrForbidden, p.tenant, p.tenant+"/")
	}
	v, err := s.eng.End(req.RequestID)
	if err != nil {
		return nil, err
	}
	s.captureEnd(req.RequestID)
	return map[string]any{"status": "ok", "version": v}, nil
}

func (s *Server) dropConversation(r *http.Request, p principal, _ []byte) (any, error) {
	k := steer.ConvKey{Tenant: r.PathValue("tenant"), ID: r.PathValue("id")}
	if !p.admin() && k.Tenant != p.tenant {
		return nil, fmt.Errorf("%w: tenant %q may drop only its own conversations", ErrForbidden, p.tenant)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Look first: DropConversation republishes the counters even when there is no latch, and a
	// 404 must change nothing.
	if !slices.Contains(s.eng.Latches().Keys(), k) {
		return nil, fmt.Errorf("%w: no latch for conversation %q/%q", ErrNotFound, k.Tenant, k.ID)
	}
	ok, err := s.eng.DropConversation(k)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: no latch for conversation %q/%q", ErrNotFound, k.Tenant, k.ID)
	}
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	return map[string]any{"status": "ok"}, nil
}

// addSteering composes a module's steering cur with a request's inline steering add as the
// fork's merge_steering_specs does: vectors at the same (hook, layer) are added (scales
// applied), other sites are kept from both; references add their strengths by name; clamps
// are concatenated (module first).
func addSteering(cur, add steer.Steering) steer.Steering {
	for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
		c, a := cur.Tier(ph), add.Tier(ph)
		for _, v := range a.Vectors {
			i := slices.IndexFunc(c.Vectors, func(x steer.Vector) bool { return x.Hook == v.Hook && x.Layer == v.Layer })
			if i < 0 || len(c.Vectors[i].Data) != len(v.Data) {
				c.Vectors = append(c.Vectors, v) // a width mismatch is refused by steer, as a duplicate
				continue
			}
			sum := make([]float32, len(v.Data))
			for j := range sum {
				sum[j] = c.Vectors[i].Scale*c.Vectors[i].Data[j] + v.Scale*v.Data[j]
			}
			c.Vectors[i] = steer.Vector{Hook: v.Hook, Layer: v.Layer, Scale: 1, Data: sum}
		}
		for _, r := range a.Refs {
			if i := slices.IndexFunc(c.Refs, func(x steer.Ref) bool { return x.Name == r.Name }); i >= 0 {
				c.Refs[i].Strength += r.Strength
			} else {
				c.Refs = append(c.Refs, r)
			}
		}
		c.Clamps = append(c.Clamps, a.Clamps...)
	}
	return cur
}

// --- status ---

// Status is GET /v1/status: the steering Status and more.
type Status struct {
	steer.Status
	KeysLive      int     `json:"keys_live"`    // = keys
	KeysRevoked   int     `json:"keys_revoked"` // = revoked_keys
	IndexUsed     uint64  `json:"index_used"`
	IndexFree     uint64  `json:"index_free"`
	ReadersPinned uint64  `json:"reader_slots_pinned"`
	ProbeVectors  int     `json:"probe_vectors"` // named vectors of kind "probe" (named_vectors counts kind "steer")
	Modules       int     `json:"modules"`
	APIKeys       int     `json:"api_keys"`
	Namespace     string  `json:"namespace"`
	StateDir      string  `json:"state_dir,omitempty"`
	StateSaves    uint64  `json:"state_saves"`
	StateDirty    bool    `json:"state_dirty"`
	StateError    string  `json:"state_error,omitempty"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	// Mirror is the NATS mirror's state (absent without --mirror).
	Mirror *mirror.Status `json:"mirror,omitempty"`
	// Capture is the capture hub's rings and consumers (absent without --capture-consumer).
	Capture *capture.HubStatus `json:"capture,omitempty"`
	// GateWork is the gate counts serve's workers reported (steer.ReportGates), summed; nil
	// where the owner does not collect them.
	GateWork *GateWork `json:"gate_work,omitempty"`
}

// RegionStatus fills the region-level fields every process can read.
func RegionStatus(eng *steer.Engine) (Status, error) {
	st, err := eng.Status()
	if err != nil {
		return Status{}, err
	}
	out := Status{Status: st, KeysLive: st.Keys, KeysRevoked: st.RevokedKeys}
	rs := eng.Region().Stats()
	out.IndexUsed = rs.Entries
	out.IndexFree = rs.IndexSlots - min(rs.Entries, rs.IndexSlots)
	out.ReadersPinned = rs.ReadersPinned
	snap, err := eng.Region().Snapshot()
	if err != nil {
		return out, err
	}
	defer snap.Close()
	probes, err := eng.ProbeInfos(&snap)
	out.ProbeVectors = len(probes)
	return out, err
}

func (s *Server) status() (Status, error) {
	out, err := RegionStatus(s.eng.Engine)
	if err != nil {
		return out, err
	}
	s.mu.Lock()
	out.Modules = len(s.modules)
	s.mu.Unlock()
	out.APIKeys = s.keys.count()
	out.Namespace = s.cfg.Namespace
	out.StateDir = s.cfg.StateDir
	out.StateSaves = s.saves.Load()
	out.StateDirty = s.dirty.Load()
	if e := s.saveErr.Load(); e != nil {
		out.StateError = *e
	}
	out.UptimeSeconds = time.Since(s.startedAt).Seconds()
	gw := s.gwork.snapshot()
	out.GateWork = &gw
	if s.mirror != nil {
		ms := s.mirror.Status()
		out.Mirror = &ms
	}
	if s.hub != nil {
		hs := s.hub.Status()
		out.Capture = &hs
	}
	return out, nil
}
