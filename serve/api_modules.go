package serve

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"sort"

	"github.com/shmsteer/shmsteer/steer"
)

type moduleRequest struct {
	Name           string     `json:"name"`
	Kind           *string    `json:"kind"`
	Vectors        vectorSpec `json:"vectors,omitempty"`
	PrefillVectors vectorSpec `json:"prefill_vectors,omitempty"`
	DecodeVectors  vectorSpec `json:"decode_vectors,omitempty"`
	Clamps         clampSpec  `json:"clamps,omitempty"`
	PrefillClamps  clampSpec  `json:"prefill_clamps,omitempty"`
	DecodeClamps   clampSpec  `json:"decode_clamps,omitempty"`
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
	sr := setRequest{Vectors: req.Vectors, PrefillVectors: req.PrefillVectors, DecodeVectors: req.DecodeVectors,
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
