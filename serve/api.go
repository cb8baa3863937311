package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/shmsteer/shmsteer/capture"
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
