package serve

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/steer"
)

// AdmitRequest is the body of POST /v1/requests/admit.
type AdmitRequest struct {
	RequestID    string      `json:"request_id"`
	Tenant       string      `json:"tenant,omitempty"`
	Conversation string      `json:"conversation,omitempty"`
	Module       string      `json:"module,omitempty"`
	Override     *setRequest `json:"override,omitempty"`
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
	req, err := decodeAdmitRequest(body)
	if err != nil {
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
