package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/serve"
	"github.com/shmsteer/shmsteer/steer"
)

// TestGateCountsReachStatusAndMetrics: a probe and a steering vector registered and a gated
// request admitted through serve's API (a serve process); a worker (this process, attached
// over ipc) steps it on the device path (steer.Batch, its scores reported back) and reports its
// gate counts; /v1/status, /v1/steering/dynamic, /metrics and `shmsteer status` (a CLI
// process) show them. A later report adds only its increments; a worker whose counts went down
// (restarted) adds all of its new ones.
func TestGateCountsReachStatusAndMetrics(t *testing.T) {
	s := startServe(t, ns(t), "")
	unit := func(i int) []float32 {
		v := make([]float32, e2eHidden)
		v[i] = 1
		return v
	}
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "probe", "name": "p", "packed": map[string]any{"post_block": packed("float32", []int{1}, [][]float32{unit(0)})}})
	s.ok("POST", "/v1/steering/vectors/register", map[string]any{"kind": "steer", "name": "s", "packed": map[string]any{"post_block": packed("float32", []int{2}, [][]float32{unit(1)})}})
	gate := func(scope string) map[string]any {
		return map[string]any{"when": map[string]any{"kind": "probe", "probe": map[string]any{"kind": "name", "name": "p"}, "threshold": 0.5, "sharpness": 100},
			"scope": scope, "apply": map[string]any{"kind": "add", "steer": map[string]any{"kind": "name", "name": "s"}}}
	}
	s.ok("POST", "/v1/requests/admit", map[string]any{"request_id": "r1", "steering": []any{gate("this_token"), gate("next_step")}})

	sec := ipc.NewSecret([]byte(e2eSecret))
	f, err := ipc.Follow(ipc.FollowOptions{Client: ipc.ClientOptions{Secret: &sec, Namespace: s.ns}, Ready: serve.IsReady})
	require.NoError(t, err)
	defer f.Close()
	eng, err := steer.Attach(f.Client().Region(), nil, steer.Options{Caller: f.Client()})
	require.NoError(t, err)
	st := eng.NewStepper()
	defer st.Close()
	b, err := st.NewBatch(steer.BatchOptions{})
	require.NoError(t, err)
	batch := []steer.Span{{ID: "r1", Start: 0, End: 2, Phase: steer.PhaseDecode}}
	steps := func(n int) {
		for range n {
			require.NoError(t, b.Resolve(0, batch, 2))
			st.End()
			require.Equal(t, 2, b.Gates.Cols)
			// rows × columns (this_token, next_step): row 0 scores 0.9, row 1 0.3 (mean 0.6)
			require.NoError(t, b.Report([]float32{0.9, 0.9, 0.3, 0.3}))
		}
	}
	steps(3)
	require.NoError(t, steer.ReportGates(f.Client(), "rank0", steer.GateReportOf(st.Stats())))

	want := func(n float64) map[string]any {
		scopes := func(tt, ns float64) map[string]any {
			return map[string]any{"this_token": tt, "next_step": ns, "rest_of_request": 0.0, "rest_of_conversation": 0.0}
		}
		return map[string]any{"workers": 1.0, "evaluations": scopes(n, n), "fires": scopes(n, n), "engaged": scopes(0, n), "reports_missed": 0.0}
	}
	require.Equal(t, want(3), s.ok("GET", "/v1/status", nil)["gate_work"])
	require.Equal(t, want(3), s.ok("GET", "/v1/steering/dynamic", nil)["gate_work"])

	metric := func(name, scope string) float64 { return metricValue(t, s.addr, name, scope) }
	require.EqualValues(t, 3, metric("shmsteer_gate_evaluations_total", "this_token"))
	require.EqualValues(t, 3, metric("shmsteer_gate_fires_total", "next_step"))
	require.EqualValues(t, 3, metric("shmsteer_gate_engaged_total", "next_step"))
	require.EqualValues(t, 0, metric("shmsteer_gate_engaged_total", "this_token"))
	require.EqualValues(t, 1, metric("shmsteer_gate_reporting_workers", ""))
	require.EqualValues(t, 0, metric("shmsteer_gate_reports_missed_total", ""))

	// Cumulative reports add their increments; a restarted worker (a new Stepper) adds its all.
	steps(2)
	require.NoError(t, steer.ReportGates(f.Client(), "rank0", steer.GateReportOf(st.Stats())))
	require.Equal(t, want(5), s.ok("GET", "/v1/status", nil)["gate_work"])
	st2 := eng.NewStepper()
	defer st2.Close()
	b, err = st2.NewBatch(steer.BatchOptions{})
	require.NoError(t, err)
	st = st2
	steps(1)
	require.NoError(t, steer.ReportGates(f.Client(), "rank0", steer.GateReportOf(st.Stats())))
	require.Equal(t, want(6), s.ok("GET", "/v1/status", nil)["gate_work"])
	require.EqualValues(t, 6, metric("shmsteer_gate_evaluations_total", "next_step"))

	// shmsteer status (a client process) reads them from serve.
	cmd := exec.Command(binPath, "status", "--json", "--namespace", s.ns)
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	require.NoError(t, cmd.Run())
	var cli map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &cli), "%s", out.String())
	require.Equal(t, want(6), cli["gate_work"])

	// Malformed reports are refused with nothing counted.
	require.ErrorIs(t, steer.ReportGates(f.Client(), "", steer.GateReport{}), steer.ErrBadConfig)
	_, err = f.Client().Call(steer.OpReportGates, []byte("short"))
	require.Error(t, err)
	require.Equal(t, want(6), s.ok("GET", "/v1/status", nil)["gate_work"])
}

// metricValue scrapes addr's /metrics: the value of the metric name, the one labelled scope
// (scope "": the family's first metric, counter or gauge).
func metricValue(t *testing.T, addr, name, scope string) float64 {
	t.Helper()
	resp, err := http.Get(addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	fam, ok := fams[name]
	require.True(t, ok, "missing %s", name)
	for _, m := range fam.GetMetric() {
		if scope == "" {
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == "scope" && l.GetValue() == scope {
				return m.Counter.GetValue()
			}
		}
	}
	t.Fatalf("%s has no scope %q", name, scope)
	return 0
}
