package steer

import (
	"encoding/binary"
	"fmt"

	"github.com/shmsteer/shmsteer/internal/proto"
)

// Gate counts travel from workers to the owner the way their determinism checksums do: a
// worker sends its Stepper's counters (cumulative since the Stepper was made) over its
// connection (ReportGates, RPC OpReportGates), and the owner that serves the op (serve) keeps
// each worker's last report and sums them into its status and metrics. Under tensor
// parallelism every rank evaluates the same gates: report from one rank per group (rank 0)
// unless per-rank counts are wanted.

// OpReportGates is the RPC op of ReportGates.
const OpReportGates uint16 = proto.OpReportGates

// GateReport is one worker's gate counts, per scope (indexed by GateScope).
type GateReport struct {
	Scopes        [4]GateStats
	ReportsMissed uint64
}

// GateReportOf is a Stepper's counters as a GateReport.
func GateReportOf(s StepStats) GateReport {
	return GateReport{Scopes: s.GateScopes, ReportsMissed: s.GateReportsMissed}
}

const gateReportLen = 8 * (4*3 + 1)

// MaxWorkerName bounds a reporting worker's name.
const MaxWorkerName = 64

// ReportGates sends a worker's gate counts to the owner; worker names it (1..MaxWorkerName
// bytes, e.g. "rank0"). ErrNotServed when the owner does not collect them (serve does).
func ReportGates(c Caller, worker string, r GateReport) error {
	if len(worker) == 0 || len(worker) > MaxWorkerName {
		return fmt.Errorf("%w: worker name of %d bytes: want 1..%d", ErrBadConfig, len(worker), MaxWorkerName)
	}
	_, err := remote{c: c}.call(OpReportGates, append(r.encode(), worker...))
	return err
}

func (r GateReport) encode() []byte {
	b := make([]byte, 0, gateReportLen+MaxWorkerName)
	for _, g := range r.Scopes {
		b = binary.LittleEndian.AppendUint64(b, g.Evaluations)
		b = binary.LittleEndian.AppendUint64(b, g.Fires)
		b = binary.LittleEndian.AppendUint64(b, g.Engaged)
	}
	return binary.LittleEndian.AppendUint64(b, r.ReportsMissed)
}

// DecodeGateReport reads an OpReportGates payload: the worker's name and its counts.
// ErrBadEncoding for a payload of the wrong length or an empty or overlong name.
func DecodeGateReport(b []byte) (string, GateReport, error) {
	var r GateReport
	if len(b) <= gateReportLen || len(b) > gateReportLen+MaxWorkerName {
		return "", r, fmt.Errorf("%w: gate report of %d bytes: want %d plus a worker name of 1..%d", ErrBadEncoding, len(b), gateReportLen, MaxWorkerName)
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	for s := range r.Scopes {
		r.Scopes[s] = GateStats{Evaluations: u(3 * s), Fires: u(3*s + 1), Engaged: u(3*s + 2)}
	}
	r.ReportsMissed = u(12)
	return string(b[gateReportLen:]), r, nil
}
