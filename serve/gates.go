package serve

import (
	"encoding/json"
	"fmt"

	"github.com/shmsteer/shmsteer/steer"
)

// unpackHook decodes the packed blob of one hook of an inline gate source (the fork's
// SteeringHookPacked), for steer.DecodeGates.
func unpackHook(hook string, raw json.RawMessage) ([]steer.Vector, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, malformed("", "SteeringHookPacked must be an object, got %s", jsonKind(raw))
	}
	p, err := packedFrom(fields, "")
	if err != nil {
		return nil, err
	}
	return p.vectors(hook)
}

// parseGates reads an admission's "steering" field (the fork's declarative gates) and checks
// that a tenant names only its own vectors.
func parseGates(raw json.RawMessage, p principal) ([]steer.Gate, error) {
	gates, err := steer.DecodeGates(raw, unpackHook)
	if err != nil {
		return nil, err
	}
	for i, g := range gates {
		for _, name := range []string{g.When.Probe.Name, g.Apply.Steer.Name} {
			if name != "" && !p.owns(name) {
				return nil, fmt.Errorf("%w: steering[%d]: named vector %q", ErrForbidden, i, name)
			}
		}
	}
	return gates, nil
}

// gateCounts is GET /v1/steering/dynamic's "gates": {requests, probes, by_scope, by_apply},
// the gates admitted requests carry now.
func (s *Server) gateCounts() (map[string]any, error) {
	snap, err := s.eng.Region().Snapshot()
	if err != nil {
		return nil, err
	}
	defer snap.Close()
	c, err := s.eng.GateCounts(&snap)
	if err != nil {
		return nil, err
	}
	return map[string]any{"requests": c.Requests, "probes": c.Probes, "by_scope": c.ByScope, "by_apply": c.ByApply}, nil
}
