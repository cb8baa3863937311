package serve

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/steer"
)

// Gate counts from the workers (steer.ReportGates, RPC OpReportGates): serve keeps each
// worker's last report and sums the increments into totals that only grow (a worker whose
// counts went down was restarted: its new counts are all new), shown in /v1/status, `shmsteer
// status` (RPC OpGateWork), GET /v1/steering/dynamic and /metrics.

// OpGateWork is the RPC op by which a client reads serve's gate totals (JSON: the gate_work
// of GET /v1/status).
const OpGateWork uint16 = proto.OpGateWork

// gateWorkTotals is the gate counts of serve's workers, summed: per scope, probe evaluations,
// fires (this_token: per row) and engagements (a next_step pulse, a rest_of_ gate engaging).
type gateWorkTotals struct {
	Workers       int               `json:"workers"` // workers that reported
	Evaluations   map[string]uint64 `json:"evaluations"`
	Fires         map[string]uint64 `json:"fires"`
	Engaged       map[string]uint64 `json:"engaged"`
	ReportsMissed uint64            `json:"reports_missed"` // device-path steps whose scores never came
}

type gateWork struct {
	mu    sync.Mutex
	last  map[string]steer.GateReport
	total steer.GateReport
}

func (g *gateWork) handle(req []byte) ([]byte, error) {
	w, r, err := steer.DecodeGateReport(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil {
		g.last = map[string]steer.GateReport{}
	}
	prev, ok := g.last[w]
	if !ok && len(g.last) >= maxChecksumWorkers {
		return nil, fmt.Errorf("%w: more than %d workers reporting gate counts", ErrBadInput, maxChecksumWorkers)
	}
	if restarted(prev, r) {
		prev = steer.GateReport{}
	}
	for s := range r.Scopes {
		t, n, p := &g.total.Scopes[s], r.Scopes[s], prev.Scopes[s]
		t.Evaluations += n.Evaluations - p.Evaluations
		t.Fires += n.Fires - p.Fires
		t.Engaged += n.Engaged - p.Engaged
	}
	g.total.ReportsMissed += r.ReportsMissed - prev.ReportsMissed
	g.last[w] = r
	return nil, nil
}

// restarted reports whether any count of r is below prev's.
func restarted(prev, r steer.GateReport) bool {
	for s := range r.Scopes {
		n, p := r.Scopes[s], prev.Scopes[s]
		if n.Evaluations < p.Evaluations || n.Fires < p.Fires || n.Engaged < p.Engaged {
			return true
		}
	}
	return r.ReportsMissed < prev.ReportsMissed
}

func (g *gateWork) snapshot() gateWorkTotals {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := gateWorkTotals{Workers: len(g.last), Evaluations: map[string]uint64{}, Fires: map[string]uint64{}, Engaged: map[string]uint64{},
		ReportsMissed: g.total.ReportsMissed}
	for s, t := range g.total.Scopes {
		name := steer.GateScope(s).String()
		out.Evaluations[name], out.Fires[name], out.Engaged[name] = t.Evaluations, t.Fires, t.Engaged
	}
	return out
}

func (g *gateWork) handleQuery([]byte) ([]byte, error) {
	return json.Marshal(g.snapshot())
}

// readGateWork asks serve (over a worker's or the CLI's connection) for its gate totals.
func readGateWork(c steer.Caller) (gateWorkTotals, error) {
	var out gateWorkTotals
	b, err := c.Call(OpGateWork, nil)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return out, fmt.Errorf("%w: gate work reply: %w", ErrBadInput, err)
	}
	return out, nil
}
