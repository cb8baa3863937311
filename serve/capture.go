package serve

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/steer"
)

// Activation capture in serve: with --capture-consumer declared, the owner runs a capture hub
// (package capture): workers register their rings with it, consumers (`shmsteer capture fs`)
// attach to it, an admission's capture is told to its consumers (Hub.Begin) and its end
// (Hub.End), and GET /v1/requests/{id}/capture answers the consumers' results.

// openCapture starts the hub when capture consumers are declared (after openOwner).
func (s *Server) openCapture() error {
	decl, err := s.cfg.CaptureDeclarations()
	if err != nil || len(decl) == 0 {
		return err
	}
	s.hub, err = capture.NewHub(capture.HubOptions{Consumers: decl, Logger: s.log})
	return err
}

// captureBegin tells the request's consumers it is admitted (before the admission answers, so
// before any step can capture its rows).
func (s *Server) captureBegin(requestID string, c steer.AdmittedCapture) {
	if s.hub != nil {
		s.hub.Begin(requestID, c)
	}
}

// captureEnd tells the request's consumers it ended.
func (s *Server) captureEnd(requestID string) {
	if s.hub != nil {
		s.hub.End(requestID)
	}
}

// captureResult is GET /v1/requests/{id}/capture: {consumer: {status, error, payload}}.
func (s *Server) captureResult(r *http.Request, p principal, _ []byte) (any, error) {
	id := r.PathValue("id")
	if !p.owns(id) {
		return nil, fmt.Errorf("%w: tenant %q may read only request ids starting with %q", ErrForbidden, p.tenant, p.tenant+"/")
	}
	if s.hub == nil {
		return nil, fmt.Errorf("%w: no capture consumers are declared (serve --capture-consumer NAME=filesystem)", ErrNotFound)
	}
	res, _ := s.hub.Result(id)
	return res, nil
}

// captureCollector exports the hub's counters to /metrics at each scrape.
type captureCollector struct {
	s                                                 *Server
	rings, records, bytes, dropped, reclaimed, occ    *prometheus.Desc
	cAttached, cReceived, cDropped, cLag, cPen, cRing *prometheus.Desc
	cQueued, cDisconnects, cBeginsDropped             *prometheus.Desc
}

func newCaptureCollector(s *Server) *captureCollector {
	cons := []string{"consumer"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("shmsteer_capture_"+name, help, labels, nil)
	}
	return &captureCollector{s: s,
		rings:          d("rings", "Workers' capture rings registered now.", nil),
		records:        d("records_total", "Capture records the workers' rings published (every ring since serve started).", nil),
		bytes:          d("bytes_total", "Captured row bytes the workers' rings published.", nil),
		dropped:        d("dropped_total", "Capture records workers dropped because a consumer lagged past its policy.", nil),
		reclaimed:      d("reclaimed_total", "Consumer slots of departed consumers freed on the rings.", nil),
		occ:            d("ring_occupancy_bytes", "Bytes of a live ring not yet released by its slowest consumer (the most of any ring).", nil),
		cAttached:      d("consumer_attached", "1 while the declared consumer is attached, else 0.", cons),
		cRing:          d("consumer_rings", "Rings the consumer reads now.", cons),
		cReceived:      d("consumer_records_total", "Records the consumer read, over every ring, as of each ring's last count.", cons),
		cDropped:       d("consumer_dropped_total", "Records dropped while the consumer lagged, over every ring.", cons),
		cLag:           d("consumer_lag_bytes", "Most bytes the consumer has not released on any ring.", cons),
		cPen:           d("consumer_pending_requests", "Captured requests whose result the consumer has not published.", cons),
		cQueued:        d("consumer_notices_queued", "Notices (ends, rings) queued for the consumer's connection.", cons),
		cDisconnects:   d("consumer_disconnects_total", "Times the hub dropped the consumer for not reading its notices (a full queue, a write timeout).", cons),
		cBeginsDropped: d("consumer_begins_dropped_total", "Requests the consumer was not told of because it was behind on its notices (their results for it are error).", cons),
	}
}

func (c *captureCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.rings, c.records, c.bytes, c.dropped, c.reclaimed, c.occ, c.cAttached, c.cRing, c.cReceived, c.cDropped, c.cLag, c.cPen,
		c.cQueued, c.cDisconnects, c.cBeginsDropped} {
		ch <- d
	}
}

func (c *captureCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.hub == nil {
		return
	}
	st := c.s.hub.Status()
	m := func(d *prometheus.Desc, t prometheus.ValueType, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, float64(v), labels...)
	}
	ct, g := prometheus.CounterValue, prometheus.GaugeValue
	m(c.rings, g, uint64(len(st.Rings)))
	m(c.records, ct, st.Totals.Records)
	m(c.bytes, ct, st.Totals.Bytes)
	m(c.dropped, ct, st.Totals.Dropped)
	m(c.reclaimed, ct, st.Totals.Reclaimed)
	m(c.occ, g, st.Totals.Occupancy)
	for _, k := range st.Consumers {
		att := uint64(0)
		if k.Attached {
			att = 1
		}
		m(c.cAttached, g, att, k.Name)
		m(c.cRing, g, uint64(k.Rings), k.Name)
		m(c.cReceived, ct, k.Received, k.Name)
		m(c.cDropped, ct, k.Dropped, k.Name)
		m(c.cLag, g, k.Lag, k.Name)
		m(c.cPen, g, uint64(k.Pending), k.Name)
		m(c.cQueued, g, uint64(k.Queued), k.Name)
		m(c.cDisconnects, ct, k.Disconnects, k.Name)
		m(c.cBeginsDropped, ct, k.BeginsDropped, k.Name)
	}
}
