package serve

import (
	"fmt"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics is serve's Prometheus registry: a collector that reads statusReply and the region's
// counters at each scrape, and latency histograms for HTTP and RPC calls.
type metrics struct {
	reg  *prometheus.Registry
	http *prometheus.HistogramVec
	rpc  *prometheus.HistogramVec
}

type desc struct {
	d   *prometheus.Desc
	typ prometheus.ValueType
}

func newDesc(name, help string, typ prometheus.ValueType) desc {
	return desc{prometheus.NewDesc("shmsteer_"+name, help, nil, nil), typ}
}

// stateCollector reads the state once per scrape.
type stateCollector struct {
	s     *Server
	descs map[string]desc
	gates *prometheus.Desc // declarative gates by scope (labelled)
	// The workers' gate counts (steer.ReportGates), by scope.
	gateEvals, gateFires, gateEngaged *prometheus.Desc
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.http = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shmsteer_http_request_duration_seconds",
		Help: "Control API request latency, by route and status code.", Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10)},
		[]string{"route", "code"})
	m.rpc = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shmsteer_rpc_duration_seconds",
		Help: "Owner-side latency of steering RPCs from attached workers, by op.", Buckets: prometheus.ExponentialBuckets(5e-6, 4, 10)},
		[]string{"op"})
	c := &stateCollector{s: s, descs: map[string]desc{}}
	add := func(key, name, help string, typ prometheus.ValueType) { c.descs[key] = newDesc(name, help, typ) }
	g, ct := prometheus.GaugeValue, prometheus.CounterValue
	add("latched", "latched_conversations", "Conversations with a latched steering override now.", g)
	add("latched_bytes", "latched_bytes", "Bytes of steering data held by value in latches now.", g)
	add("evictions", "latch_evictions_total", "Latches evicted to fit the conversation or byte cap.", ct)
	add("oversize", "latch_oversize_refusals_total", "Overrides larger than the latch byte cap, not latched.", ct)
	add("triggers", "latch_triggers_total", "Overrides offered for latching.", ct)
	add("bridges", "latch_bridges_total", "Requests that inherited their conversation's latch.", ct)
	add("bridge_drops", "latch_bridge_drops_total", "Latches dropped at a bridge because a named vector changed or went.", ct)
	add("named", "named_vectors", "Registered named steering vectors.", g)
	add("requests", "requests_with_steering", "Admitted requests carrying steering now.", g)
	add("keys_live", "keys_live", "Live per-request keys in the key registry.", g)
	add("keys_revoked", "keys_revoked", "Revoked key sentinels waiting for their purge.", g)
	add("arena_used", "arena_used_bytes", "Region arena bytes in use (live, retired, markers).", g)
	add("arena_free", "arena_free_bytes", "Region arena bytes free.", g)
	add("index_used", "index_used_slots", "Region index slots holding a live value.", g)
	add("index_free", "index_free_slots", "Region index slots not holding a live value.", g)
	add("columns", "columns", "Region column pool capacity: requests admitted at once with their own vectors laid out site by site (0 without a pool).", g)
	add("columns_used", "columns_used", "Region column pool columns attached to values or retired (0 without a pool).", g)
	add("columns_retired", "columns_retired", "Region column pool columns retired and waiting for readers to move on.", g)
	add("columns_fallbacks", "columns_fallbacks_total", "Compositions (admissions, recompositions for a named vector) whose vectors went to their entry because the column pool was full: their decode steps run slower; raise --columns.", ct)
	add("clients", "attached_clients", "Worker processes attached now.", g)
	add("version", "region_version", "Last published region version.", g)
	add("readers_pinned", "reader_slots_pinned", "Reader slots inside a read section now.", g)
	add("pin_age", "oldest_reader_pin_age_seconds", "How long the reader slot pinned at the lowest version has held it (0: no pin); seconds mean a stuck worker or a snapshot left open.", g)
	add("modules", "steering_modules", "Registered steering modules.", g)
	add("state_saves", "state_saves_total", "State files written since start.", ct)
	add("api_keys", "api_keys", "API keys configured.", g)
	add("gated", "gated_requests", "Admitted requests carrying declarative gates now.", g)
	c.gates = prometheus.NewDesc("shmsteer_gates", "Declarative gates admitted requests carry now, by scope (evaluations and fires are counted by each worker's Stepper and reported to serve).", []string{"scope"}, nil)
	c.gateEvals = prometheus.NewDesc("shmsteer_gate_evaluations_total", "Probe reads of declarative gates (one per request per probe gate per step) the workers reported, by scope.", []string{"scope"}, nil)
	c.gateFires = prometheus.NewDesc("shmsteer_gate_fires_total", "Probe gates that fired (this_token: per row) the workers reported, by scope.", []string{"scope"}, nil)
	c.gateEngaged = prometheus.NewDesc("shmsteer_gate_engaged_total", "Gates that engaged for later steps (a next_step pulse, a rest_of_ gate engaging) the workers reported, by scope.", []string{"scope"}, nil)
	add("gate_missed", "gate_reports_missed_total", "Device-path steps whose probe scores the worker never reported (their probes counted as not fired).", ct)
	add("gate_workers", "gate_reporting_workers", "Workers that reported gate counts.", g)
	// The mirror's series exist only with --mirror.
	add("m_connected", "mirror_connected", "1 while the mirror's NATS connection is up, else 0 (local serving goes on either way).", g)
	add("m_ready", "mirror_ready", "1 once the mirror's bucket is open, else 0.", g)
	add("m_synced", "mirror_initial_sync_done", "1 once the bucket's content at start has been applied to this host, else 0.", g)
	add("m_queue", "mirror_queue_depth", "Local changes waiting to be published to NATS (outgoing lag, in changes).", g)
	add("m_queue_limit", "mirror_queue_limit", "Most distinct local changes the mirror queues before refusing (queue full).", g)
	add("m_oldest", "mirror_oldest_queued_seconds", "Age of the oldest local change not yet published (outgoing lag; 0: none).", g)
	add("m_pending_in", "mirror_pending_in", "Bucket changes not yet delivered to this host as of the last delivery (incoming lag).", g)
	add("m_last_applied", "mirror_last_applied_timestamp_seconds", "Unix time of the last change applied from another host (0: none yet).", g)
	add("m_published", "mirror_published_total", "Local changes stored in the bucket.", ct)
	add("m_applied", "mirror_applied_total", "Changes of other hosts applied to the local region.", ct)
	add("m_stale", "mirror_stale_total", "Changes of other hosts superseded by a newer value here (last writer wins).", ct)
	add("m_rejected", "mirror_rejected_total", "Bucket values rejected as not decodable, invalid, of the old format, or beyond the remote bound (values failing authentication count in mirror_tampered_total).", ct)
	add("m_tampered", "mirror_tampered_total", "Bucket values and deletes that failed authentication (written without the secret, another secret, or modified).", ct)
	add("m_replayed", "mirror_replayed_total", "Authenticated bucket values refused as older than their host's newest applied here (replays).", ct)
	add("m_queue_full", "mirror_queue_full_total", "Local changes not mirrored because the queue was full (the local write stands).", ct)
	add("m_reconnects", "mirror_reconnects_total", "Reconnections of the mirror to NATS.", ct)
	bi := prometheus.NewGauge(prometheus.GaugeOpts{Name: "shmsteer_build_info",
		Help:        "Always 1; the labels name the running binary: its version (see Version) and VCS revision.",
		ConstLabels: prometheus.Labels{"version": Version(), "revision": revision()}})
	bi.Set(1)
	m.reg.MustRegister(c, newCaptureCollector(s), m.http, m.rpc, bi, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d.d
	}
	ch <- c.gates
	ch <- c.gateEvals
	ch <- c.gateFires
	ch <- c.gateEngaged
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.s.status()
	if err != nil {
		c.s.log.Warn("metrics: reading status", "err", err)
		return
	}
	emit := func(key string, v float64) {
		d := c.descs[key]
		ch <- prometheus.MustNewConstMetric(d.d, d.typ, v)
	}
	emit("latched", float64(st.LatchedConversations))
	emit("latched_bytes", float64(st.LatchedBytes))
	emit("evictions", float64(st.Evictions))
	emit("oversize", float64(st.OversizeRefusals))
	emit("triggers", float64(st.Triggers))
	emit("bridges", float64(st.Bridges))
	emit("bridge_drops", float64(st.BridgeDrops))
	emit("named", float64(st.NamedVectors))
	emit("requests", float64(st.RequestsWithSteering))
	emit("keys_live", float64(st.KeysLive))
	emit("keys_revoked", float64(st.KeysRevoked))
	emit("arena_used", float64(st.ArenaUsed))
	emit("arena_free", float64(st.ArenaFree))
	emit("index_used", float64(st.IndexUsed))
	emit("index_free", float64(st.IndexFree))
	emit("columns", float64(st.Columns))
	emit("columns_used", float64(st.ColumnsUsed))
	emit("columns_retired", float64(st.ColumnsRetired))
	emit("columns_fallbacks", float64(st.ColumnsFallbacks))
	emit("clients", float64(st.AttachedClients))
	emit("version", float64(st.Version))
	emit("readers_pinned", float64(st.ReadersPinned))
	pinAge := 0.0
	if st.OldestPin != nil {
		pinAge = st.OldestPin.AgeSeconds
	}
	emit("pin_age", pinAge)
	emit("modules", float64(st.Modules))
	emit("state_saves", float64(st.StateSaves))
	emit("api_keys", float64(st.APIKeys))
	if snap, err := c.s.eng.Region().Snapshot(); err == nil {
		gc, err := c.s.eng.GateCounts(&snap)
		snap.Close()
		if err != nil {
			c.s.log.Warn("metrics: counting gates", "err", err)
		} else {
			emit("gated", float64(gc.Requests))
			for scope, n := range gc.ByScope {
				ch <- prometheus.MustNewConstMetric(c.gates, prometheus.GaugeValue, float64(n), scope)
			}
		}
	}
	if gw := st.GateWork; gw != nil {
		emit("gate_missed", float64(gw.ReportsMissed))
		emit("gate_workers", float64(gw.Workers))
		for scope, n := range gw.Evaluations {
			ch <- prometheus.MustNewConstMetric(c.gateEvals, prometheus.CounterValue, float64(n), scope)
			ch <- prometheus.MustNewConstMetric(c.gateFires, prometheus.CounterValue, float64(gw.Fires[scope]), scope)
			ch <- prometheus.MustNewConstMetric(c.gateEngaged, prometheus.CounterValue, float64(gw.Engaged[scope]), scope)
		}
	}
	if ms := st.Mirror; ms != nil {
		b := func(v bool) float64 {
			if v {
				return 1
			}
			return 0
		}
		emit("m_connected", b(ms.Connected))
		emit("m_ready", b(ms.Ready))
		emit("m_synced", b(ms.InitialSync))
		emit("m_queue", float64(ms.QueueDepth))
		emit("m_queue_limit", float64(ms.QueueLimit))
		emit("m_oldest", ms.OldestQueued.Seconds())
		emit("m_pending_in", float64(ms.PendingIn))
		lastApplied := 0.0
		if !ms.LastApplied.IsZero() {
			lastApplied = float64(ms.LastApplied.UnixNano()) / 1e9
		}
		emit("m_last_applied", lastApplied)
		emit("m_published", float64(ms.Published))
		emit("m_applied", float64(ms.Applied))
		emit("m_stale", float64(ms.Stale))
		emit("m_rejected", float64(ms.Rejected))
		emit("m_tampered", float64(ms.Tampered))
		emit("m_replayed", float64(ms.Replayed))
		emit("m_queue_full", float64(ms.QueueFull))
		emit("m_reconnects", float64(ms.Reconnects))
	}
}

// devVersion is the version of a binary built from a checkout (no module version).
const devVersion = "v0.0.0-dev"

// Version is the running binary's version: its module version when it has one (go install
// MODULE@VERSION, or the pseudo-version naming the commit that go build stamps from a git
// checkout, "+dirty" for a changed tree), otherwise v0.0.0-dev followed by the VCS revision
// if one was stamped, or by "(no VCS stamp)" when none was: GOFLAGS=-buildvcs=false, a build
// outside a git checkout, or go run.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	if r := revision(); r != "" {
		return devVersion + "+" + r
	}
	return devVersion + " (no VCS stamp)"
}

// revision is the VCS revision the build stamped (12 hex digits, "-dirty" when modified), or "".
func revision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return ""
	}
	return rev + dirty
}

// timeRPC wraps an RPC handler to observe its latency.
func (m *metrics) timeRPC(op uint16, h func([]byte) ([]byte, error)) func([]byte) ([]byte, error) {
	name := opNames[op]
	if name == "" {
		name = fmt.Sprint(op)
	}
	obs := m.rpc.WithLabelValues(name)
	return func(req []byte) ([]byte, error) {
		t := time.Now()
		out, err := h(req)
		obs.Observe(time.Since(t).Seconds())
		return out, err
	}
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// timeHTTP wraps a handler to observe its latency under route.
func (m *metrics) timeHTTP(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h(sw, r)
		m.http.WithLabelValues(route, strconv.Itoa(sw.code)).Observe(time.Since(t).Seconds())
	}
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
