package serve

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/mirror"
	"github.com/shmsteer/shmsteer/steer"
)

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

// statusReply is GET /v1/status: the steering Status and more.
type statusReply struct {
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
	GateWork *gateWorkTotals `json:"gate_work,omitempty"`
}

// regionStatus fills the region-level fields every process can read.
func regionStatus(eng *steer.Engine) (statusReply, error) {
	st, err := eng.Status()
	if err != nil {
		return statusReply{}, err
	}
	out := statusReply{Status: st, KeysLive: st.Keys, KeysRevoked: st.RevokedKeys}
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

func (s *Server) status() (statusReply, error) {
	out, err := regionStatus(s.eng.Engine)
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
