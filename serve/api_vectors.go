package serve

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// vectorSummary is one named vector in listings ("details" of GET /v1/steering/vectors).
type vectorSummary struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
	Entries int    `json:"entries"`
	// ModelHint is a steering vector's model hint (a GGUF's controlvector.model_hint kept
	// with it; absent when it has none).
	ModelHint string `json:"model_hint,omitempty"`
}

// vectorSummaries lists the named vectors (steer, then probe, each by name) a principal may see.
func vectorSummaries(eng *steer.Engine, visible func(string) bool) ([]vectorSummary, error) {
	snap, err := eng.Region().Snapshot()
	if err != nil {
		return nil, err
	}
	defer snap.Close()
	out := []vectorSummary{}
	for _, kind := range []steer.VectorKind{steer.VectorSteer, steer.VectorProbe} {
		infos, read := eng.VectorInfos, eng.Vector
		if kind == steer.VectorProbe {
			infos, read = eng.ProbeInfos, eng.Probe
		}
		list, err := infos(&snap)
		if err != nil {
			return nil, err
		}
		var part []vectorSummary
		for _, in := range list {
			if !visible(in.Name) {
				continue
			}
			vs := vectorSummary{Name: in.Name, Kind: kind.String(), Version: in.Version, Digest: hex.EncodeToString(in.Digest[:]), ModelHint: in.ModelHint}
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
func vectorsByKind(list []vectorSummary) map[string][]string {
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
		var pk vecfile.Packed
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
	list, err := vectorSummaries(s.eng.Engine, p.owns)
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
		list, lerr := vectorSummaries(s.eng.Engine, p.owns)
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
	list, err := vectorSummaries(s.eng.Engine, p.owns)
	if dropped == nil {
		dropped = []string{}
	}
	return map[string]any{"status": "ok", "name": req.Name, "kind": kind.String(), "version": v, "vectors": vectorsByKind(list),
		"dropped_references": dropped}, err
}

// listVectors answers the fork's exact {vectors, count}; ?details=1 adds serve's details.
func (s *Server) listVectors(r *http.Request, p principal, _ []byte) (any, error) {
	list, err := vectorSummaries(s.eng.Engine, p.owns)
	out := map[string]any{"vectors": vectorsByKind(list), "count": len(list)}
	if d := r.URL.Query().Get("details"); d != "" && d != "0" && d != "false" {
		out["details"] = list
	}
	return out, err
}
