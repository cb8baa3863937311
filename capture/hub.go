//go:build linux

package capture

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/steer"
	"golang.org/x/sys/unix"
)

// HubOptions configure NewHub.
type HubOptions struct {
	// Consumers are the consumers the owner declares: name → type ("filesystem"). Only these
	// may attach, one process per name at a time.
	Consumers map[string]string
	// AllowUIDs lists uids allowed on capture connections besides the owner's own (as
	// ipc.OwnerOptions.AllowUIDs).
	AllowUIDs []int
	// MaxResults bounds the ended requests whose results are kept (the oldest go first);
	// 0 means 4096.
	MaxResults int
	// WriteTimeout bounds the write of a queued notice to one consumer (an end, a ring): a
	// consumer that does not read its connection within it is dropped, its requests end with
	// status error. 0 means 1 s. An End never waits on it (notices queue); an admission's
	// Begin waits only while a consumer takes a begin larger than its socket's free space (a
	// large spec), or up to 100 ms for room in a full socket (huboutbox.go).
	WriteTimeout time.Duration
	// MaxQueued and MaxQueuedBytes bound each consumer's queue of notices not yet written to
	// its connection; a consumer whose queue is full is disconnected, counted in
	// ConsumerStatus.Disconnects. 0 means DefaultMaxQueued, DefaultMaxQueuedBytes.
	MaxQueued, MaxQueuedBytes int
	// Logger receives attach, detach and drop events; nil means slog.Default().
	Logger *slog.Logger
}

// Hub is the owner's side of capture: workers register their rings with it, consumers attach to
// it and receive every ring's memfd (and later workers' as they come), it tells consumers when a
// captured request begins and ends, and keeps the results they publish. Its methods are safe for
// concurrent use.
type Hub struct {
	log            *slog.Logger
	consumers      map[string]string
	allow          []int
	maxRes         int
	wtimeout       time.Duration
	maxQueued      int
	maxQueuedBytes int
	ln             *net.UnixListener
	name           string // abstract socket name, without the leading NUL

	mu       sync.Mutex
	tickets  map[[ticketLen]byte]ticket
	rings    map[uint32]*hubRing
	nextRing uint32
	live     map[string]*hubConn // consumers by name
	conns    map[*hubConn]struct{}
	reqs     map[string]*hubReq
	ended    []string // ended request ids, oldest first (results kept up to maxRes)
	closed   bool
	// Counters of what is gone, so Status's totals keep counting: rings whose worker left,
	// and per consumer name the slots it no longer reads (a ring gone, a connection closed).
	goneRings     RingStats
	goneCons      map[string]slotTotals
	disconnects   map[string]uint64 // consumers dropped for not taking their notices, by name
	beginsDropped map[string]uint64 // begins consumers were not told of, by name
	wg            sync.WaitGroup
}

type ticket struct {
	role    byte
	name    string
	expires time.Time
}

type hubRing struct {
	id     uint32
	r      *Ring
	worker *hubConn
}

type slotTotals struct{ received, dropped uint64 }

type slotRef struct {
	ring uint32
	slot int
	pid  int // the pid the slot records
}

type hubConn struct {
	c     *net.UnixConn
	role  byte
	name  string
	pid   int
	wmu   sync.Mutex
	slots []slotRef // consumer: slots it attached (guarded by Hub.mu)
	out   outbox    // consumer: its notices (huboutbox.go)
	// kicked: the hub disconnected it for not taking its notices (guarded by Hub.mu).
	kicked bool
}

type hubReq struct {
	results map[string]*Result // by consumer name
	ended   bool
}

// NewHub listens on a fresh abstract socket (its name travels only in OpCaptureTicket replies,
// over the owner's authenticated connection) and serves capture connections until Close.
func NewHub(opts HubOptions) (*Hub, error) {
	for name := range opts.Consumers {
		if err := checkConsumerName(name); err != nil {
			return nil, err
		}
	}
	h := &Hub{log: opts.Logger, consumers: maps(opts.Consumers), allow: opts.AllowUIDs, maxRes: opts.MaxResults, wtimeout: opts.WriteTimeout,
		tickets: map[[ticketLen]byte]ticket{}, rings: map[uint32]*hubRing{}, live: map[string]*hubConn{}, conns: map[*hubConn]struct{}{},
		reqs: map[string]*hubReq{}, goneCons: map[string]slotTotals{}, disconnects: map[string]uint64{}, beginsDropped: map[string]uint64{},
		maxQueued: opts.MaxQueued, maxQueuedBytes: opts.MaxQueuedBytes}
	if h.maxQueued <= 0 {
		h.maxQueued = DefaultMaxQueued
	}
	if h.maxQueuedBytes <= 0 {
		h.maxQueuedBytes = DefaultMaxQueuedBytes
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	if h.maxRes <= 0 {
		h.maxRes = 4096
	}
	if h.wtimeout <= 0 {
		h.wtimeout = time.Second
	}
	var nb [16]byte
	rand.Read(nb[:])
	h.name = "shmsteer-capture-" + hex.EncodeToString(nb[:])
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + h.name, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("%w: listening for capture connections: %v", ErrWrite, err)
	}
	h.ln = ln
	h.wg.Add(1)
	go h.acceptLoop()
	return h, nil
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Consumers lists the declared consumers' names, sorted.
func (h *Hub) Consumers() []string {
	names := make([]string, 0, len(h.consumers))
	for n := range h.consumers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// OpTicket is the RPC op a worker or consumer asks the owner's hub for a capture connection
// ticket with (Serve registers it).
const OpTicket = uint16(proto.OpCaptureTicket)

// Serve registers the ticket RPC (OpTicket) with the owner's RPC handlers; with an
// *ipc.Owner o pass func(op uint16, h func([]byte) ([]byte, error)) { o.Handle(op, h) }.
func (h *Hub) Serve(handle steer.HandleFunc) { handle(OpTicket, h.issueTicket) }

// issueTicket answers OpCaptureTicket: u8 role, name → u8 socket name length, socket name,
// ticket. A consumer's name must be declared and not attached.
func (h *Hub) issueTicket(req []byte) ([]byte, error) {
	if len(req) < 1 || (req[0] != roleConsumer && req[0] != roleWorker) {
		return nil, fmt.Errorf("%w: ticket request with role %d", ErrHubProtocol, firstOr(req))
	}
	role, name := req[0], string(req[1:])
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, fmt.Errorf("%w: closed", ErrNoHub)
	}
	if role == roleConsumer {
		if err := h.checkConsumer(name); err != nil {
			return nil, err
		}
	}
	var t [ticketLen]byte
	rand.Read(t[:])
	now := time.Now()
	for k, v := range h.tickets {
		if now.After(v.expires) {
			delete(h.tickets, k)
		}
	}
	if len(h.tickets) >= 1024 {
		return nil, fmt.Errorf("%w: too many capture attaches in flight; retry", ErrConsumerTaken)
	}
	h.tickets[t] = ticket{role: role, name: name, expires: now.Add(10 * time.Second)}
	out := append([]byte{byte(len(h.name))}, h.name...)
	return append(out, t[:]...), nil
}

func (h *Hub) checkConsumer(name string) error {
	if _, ok := h.consumers[name]; !ok {
		return fmt.Errorf("%w: %q (declared: %v)", ErrUnknownConsumer, name, h.Consumers())
	}
	if c := h.live[name]; c != nil {
		return fmt.Errorf("%w: %q (pid %d)", ErrConsumerTaken, name, c.pid)
	}
	return nil
}

func (h *Hub) acceptLoop() {
	defer h.wg.Done()
	for {
		c, err := h.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			h.log.Warn("shmsteer: capture accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		h.wg.Add(1)
		go h.serveConn(c)
	}
}

// serveConn runs one capture connection: hello (the ticket), then the role's messages until it
// closes.
func (h *Hub) serveConn(c *net.UnixConn) {
	defer h.wg.Done()
	defer c.Close()
	cred, err := peerCred(c)
	if err != nil || (int(cred.Uid) != os.Getuid() && !slices.Contains(h.allow, int(cred.Uid))) {
		return
	}
	hc := &hubConn{c: c, pid: int(cred.Pid), out: newOutbox()}
	rd := &msgReader{c: c}
	defer rd.closeFds()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	m, err := rd.next()
	if err != nil || m.typ != msgHello {
		return
	}
	var t [ticketLen]byte
	copy(t[:], m.ticket)
	h.mu.Lock()
	tk, ok := h.tickets[t]
	delete(h.tickets, t)
	refuse := ""
	switch {
	case h.closed:
		refuse = "shmsteer: the capture hub is closing"
	case !ok || tk.role != m.role || time.Now().After(tk.expires):
		refuse = "shmsteer: capture ticket unknown or expired: attach again"
	case tk.role == roleConsumer:
		if err := h.checkConsumer(tk.name); err != nil {
			refuse = err.Error()
		}
	}
	if refuse != "" {
		h.mu.Unlock()
		hc.send(h.wtimeout, encodeHubMsg(nil, hubMsg{typ: msgRefused, message: refuse}), nil)
		return
	}
	hc.role, hc.name = tk.role, tk.name
	h.conns[hc] = struct{}{}
	var pushErr error
	if hc.role == roleConsumer {
		// Its handshake is queued as it goes live, so every notice it is told after comes
		// after it: the welcome, the rings there are (later ones are notices), then the
		// writer's synced (huboutbox.go).
		h.live[hc.name] = hc
		rings := make([]*hubRing, 0, len(h.rings))
		for _, r := range h.rings {
			rings = append(rings, r)
		}
		sort.Slice(rings, func(i, j int) bool { return rings[i].id < rings[j].id })
		pushErr = hc.out.push(encodeHubMsg(nil, hubMsg{typ: msgWelcome}), nil)
		for _, r := range rings {
			if pushErr == nil {
				pushErr = hc.out.push(encodeHubMsg(nil, hubMsg{typ: msgRing, ring: r.id}), []int{r.r.Fd()})
			}
		}
	}
	h.mu.Unlock()
	defer h.drop(hc)
	defer hc.out.close()
	c.SetReadDeadline(time.Time{})
	if hc.role == roleConsumer {
		if pushErr != nil {
			h.log.Warn("shmsteer: dropping capture consumer", "consumer", hc.name, "pid", hc.pid, "err", pushErr)
			return
		}
		h.log.Info("shmsteer: capture consumer attached", "consumer", hc.name, "pid", hc.pid)
		h.wg.Add(1)
		go h.writeLoop(hc)
	} else if hc.send(h.wtimeout, encodeHubMsg(nil, hubMsg{typ: msgWelcome}), nil) != nil {
		return
	}
	for {
		m, err := rd.next()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				h.log.Warn("shmsteer: dropping capture connection", "role", hc.role, "name", hc.name, "pid", hc.pid, "err", err)
			}
			return
		}
		if err := h.handle(hc, m, rd); err != nil {
			h.log.Warn("shmsteer: dropping capture connection", "role", hc.role, "name", hc.name, "pid", hc.pid, "err", err)
			return
		}
	}
}

// handle serves one message after the hello.
func (h *Hub) handle(hc *hubConn, m hubMsg, rd *msgReader) error {
	switch {
	case hc.role == roleWorker && m.typ == msgRing:
		fd, ok := rd.takeFd()
		if !ok {
			return fmt.Errorf("%w: a ring message without its memfd", ErrHubProtocol)
		}
		// OpenRing refuses a memfd not sealed against resizing, or not of its header's size,
		// before mapping it: no worker can make the owner's or a consumer's reads fault.
		r, err := OpenRing(fd)
		unix.Close(fd)
		if err != nil {
			hc.send(h.wtimeout, encodeHubMsg(nil, hubMsg{typ: msgRefused, message: err.Error()}), nil)
			return err
		}
		h.mu.Lock()
		h.nextRing++
		hr := &hubRing{id: h.nextRing, r: r, worker: hc}
		h.rings[hr.id] = hr
		targets := h.liveConsumers()
		h.mu.Unlock()
		h.log.Info("shmsteer: capture ring registered", "ring", hr.id, "worker_pid", hc.pid, "capacity", r.cap)
		msg := encodeHubMsg(nil, hubMsg{typ: msgRing, ring: hr.id})
		for _, t := range targets {
			t.notify(h, msg, []int{r.Fd()}, false)
		}
		// The worker hears synced once every consumer attached now has a slot on its ring
		// (or ringSyncWait passed): what it appends after RegisterWorker returns reaches
		// them all.
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.awaitSlots(hr.id, targets)
			hc.send(h.wtimeout, encodeHubMsg(nil, hubMsg{typ: msgSynced}), nil)
		}()
	case hc.role == roleConsumer && m.typ == msgSlot:
		h.mu.Lock()
		defer h.mu.Unlock()
		hr := h.rings[m.ring]
		if hr == nil {
			return nil // the ring's worker left meanwhile
		}
		pid := int(m.pid)
		if hr.r.adoptSlot(int(m.slot), pid, hc.pid) {
			pid = hc.pid
		}
		hc.slots = append(hc.slots, slotRef{ring: m.ring, slot: int(m.slot), pid: pid})
	case hc.role == roleConsumer && m.typ == msgResult:
		if err := checkPayload(m.spec); err != nil {
			return err
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if q := h.reqs[m.id]; q != nil {
			if r := q.results[hc.name]; r != nil {
				*r = Result{Status: m.status, Error: m.message, Payload: json.RawMessage(slices.Clone(m.spec)), Global: r.Global}
			}
		}
	default:
		return fmt.Errorf("%w: message type %d on a %s connection", ErrHubProtocol, m.typ, roleName(hc.role))
	}
	return nil
}

// ringSyncWait bounds how long a worker's registration waits for consumers to attach its ring.
const ringSyncWait = 2 * time.Second

// awaitSlots waits until each of targets that is still attached has reported a slot on ring
// id, at most ringSyncWait.
func (h *Hub) awaitSlots(id uint32, targets []*hubConn) {
	for deadline := time.Now().Add(ringSyncWait); time.Now().Before(deadline); time.Sleep(200 * time.Microsecond) {
		h.mu.Lock()
		done := !h.closed
		for _, t := range targets {
			if h.live[t.name] == t && !slices.ContainsFunc(t.slots, func(s slotRef) bool { return s.ring == id }) {
				done = false
			}
		}
		closed := h.closed
		h.mu.Unlock()
		if done || closed {
			return
		}
	}
}

func roleName(r byte) string {
	if r == roleWorker {
		return "worker"
	}
	return "consumer"
}

func (h *Hub) liveConsumers() []*hubConn {
	out := make([]*hubConn, 0, len(h.live))
	for _, c := range h.live {
		out = append(out, c)
	}
	return out
}

// drop forgets a closed connection: a worker's ring goes (consumers are told), a consumer's
// slots are freed and its pending requests end with status error.
func (h *Hub) drop(hc *hubConn) {
	h.mu.Lock()
	delete(h.conns, hc)
	var gone []*hubRing
	if hc.role == roleWorker {
		for id, r := range h.rings {
			if r.worker == hc {
				gone = append(gone, r)
				delete(h.rings, id)
			}
		}
	}
	for _, r := range gone {
		h.retireRing(r)
	}
	freed := 0
	if hc.role == roleConsumer && h.live[hc.name] == hc {
		delete(h.live, hc.name)
		for _, s := range hc.slots {
			r := h.rings[s.ring]
			if r == nil {
				continue
			}
			if ss := r.r.Slots(); s.slot < len(ss) && ss[s.slot].PID == s.pid {
				t := h.goneCons[hc.name]
				t.received += ss[s.slot].Received
				t.dropped += ss[s.slot].Dropped
				h.goneCons[hc.name] = t
			}
			if r.r.freeSlot(s.slot, s.pid) {
				freed++
			}
		}
		for _, q := range h.reqs {
			if r := q.results[hc.name]; r != nil && r.Status == StatusPending {
				*r = Result{Status: StatusError, Error: fmt.Sprintf("shmsteer: capture consumer %q (pid %d) left before publishing its result", hc.name, hc.pid), Global: r.Global}
			}
		}
	}
	targets := h.liveConsumers()
	h.mu.Unlock()
	if hc.role == roleConsumer && hc.name != "" {
		h.log.Info("shmsteer: capture consumer detached", "consumer", hc.name, "pid", hc.pid, "slots_freed", freed)
	}
	for _, r := range gone {
		msg := encodeHubMsg(nil, hubMsg{typ: msgRingGone, ring: r.id})
		for _, t := range targets {
			t.notify(h, msg, nil, false)
		}
		r.r.Close()
	}
}

// retireRing adds a departing ring's counters, and each live consumer's slot on it, to the
// totals of what is gone (h.mu held).
func (h *Hub) retireRing(r *hubRing) {
	st := r.r.Stats()
	h.goneRings.Records += st.Records
	h.goneRings.Bytes += st.Bytes
	h.goneRings.Dropped += st.Dropped
	h.goneRings.Reclaimed += st.Reclaimed
	ss := r.r.Slots()
	for _, c := range h.live {
		for _, s := range c.slots {
			if s.ring == r.id && s.slot < len(ss) && ss[s.slot].Attached && ss[s.slot].PID == s.pid {
				t := h.goneCons[c.name]
				t.received += ss[s.slot].Received
				t.dropped += ss[s.slot].Dropped
				h.goneCons[c.name] = t
			}
		}
	}
}

// Begin records that request id is captured for the consumers c.Specs names (each consumer's
// raw spec as the owner stored it at admission: steer.Admitted.Capture, the consumers' global
// specs included) and tells each attached one, before it returns, so the notice is in the
// consumer's socket before any step writes the request's records. A consumer not attached,
// and one in c.Skipped (its global spec did not apply), gets status error at once. A request
// id already begun is begun again (its earlier results are dropped).
func (h *Hub) Begin(id string, c steer.AdmittedCapture) {
	if len(c.Specs)+len(c.Skipped) == 0 || id == "" || len(id) > 65535 {
		return
	}
	type target struct {
		c   *hubConn
		msg []byte
	}
	var ts []target
	h.mu.Lock()
	q := &hubReq{results: map[string]*Result{}}
	h.ended = slices.DeleteFunc(h.ended, func(e string) bool { return e == id })
	h.reqs[id] = q
	for name, err := range c.Skipped {
		q.results[name] = &Result{Status: StatusError, Error: err.Error(), Global: true}
	}
	for name, spec := range c.Specs {
		r := &Result{Status: StatusPending, Global: c.Global[name]}
		q.results[name] = r
		switch hc := h.live[name]; {
		case h.consumers[name] == "":
			*r = Result{Status: StatusError, Error: fmt.Sprintf("shmsteer: capture consumer %q is not declared by the owner", name), Global: r.Global}
		case hc == nil:
			*r = Result{Status: StatusError, Error: fmt.Sprintf("shmsteer: capture consumer %q was not attached when the request was admitted", name), Global: r.Global}
		default:
			ts = append(ts, target{hc, encodeHubMsg(nil, hubMsg{typ: msgBegin, id: id, prompt: uint32(max(0, c.PromptLen)), spec: spec})})
		}
	}
	h.mu.Unlock()
	for _, t := range ts {
		if !t.c.notify(h, t.msg, nil, true) {
			h.mu.Lock()
			if r := q.results[t.c.name]; r != nil && r.Status == StatusPending && h.reqs[id] == q {
				*r = Result{Status: StatusError, Global: r.Global,
					Error: fmt.Sprintf("shmsteer: capture consumer %q was behind on its notices (it does not read its connection), so it was not told of the request", t.c.name)}
			}
			h.mu.Unlock()
		}
	}
}

// End tells the consumers of a captured request that it ended (every record of it is in the
// rings by then: steps finish before the scheduler ends a request). The result is final once
// each has published. A request not captured is ignored.
func (h *Hub) End(id string) {
	var ts []*hubConn
	h.mu.Lock()
	q := h.reqs[id]
	if q == nil || q.ended {
		h.mu.Unlock()
		return
	}
	q.ended = true
	h.ended = append(h.ended, id)
	for len(h.ended) > h.maxRes {
		delete(h.reqs, h.ended[0])
		h.ended = h.ended[1:]
	}
	for name, r := range q.results {
		if c := h.live[name]; c != nil && r.Status == StatusPending {
			ts = append(ts, c)
		}
	}
	h.mu.Unlock()
	msg := encodeHubMsg(nil, hubMsg{typ: msgEnd, id: id})
	for _, c := range ts {
		c.notify(h, msg, nil, false)
	}
}

// Result is every declared consumer's result for request id: pending until the consumer
// publishes, not_requested for a consumer the request's capture does not name (and for every
// consumer of a request never captured, or whose result was dropped past MaxResults). Final
// once ended and published: Ended says whether the request has ended.
func (h *Hub) Result(id string) (results map[string]Result, ended bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	results = map[string]Result{}
	for name := range h.consumers {
		results[name] = Result{Status: StatusNotRequested}
	}
	q := h.reqs[id]
	if q == nil {
		return results, false
	}
	for name, r := range q.results {
		results[name] = *r
	}
	return results, q.ended
}

// RingStatus is one worker's ring as the owner sees it.
type RingStatus struct {
	ID        uint32 `json:"id"`
	WorkerPID int    `json:"worker_pid"`
	Capacity  uint64 `json:"capacity_bytes"`
	RingStats
}

// ConsumerStatus is one declared consumer.
type ConsumerStatus struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Attached bool   `json:"attached"`
	PID      int    `json:"pid,omitempty"`
	Rings    int    `json:"rings"`            // rings it reads
	Received uint64 `json:"records_received"` // since the hub started, over every ring
	Dropped  uint64 `json:"records_dropped"`  // since the hub started, over every ring
	Lag      uint64 `json:"lag_bytes"`        // the most bytes it has not released on any ring
	Pending  int    `json:"requests_pending"`
	Queued   int    `json:"notices_queued"` // notices waiting for its connection
	// Disconnects counts the times the hub dropped it for not taking its notices (a full
	// queue, a notice not read within the write timeout), since the hub started.
	Disconnects uint64 `json:"disconnects"`
	// BeginsDropped counts the requests it was not told of because it was behind on its
	// notices (their results for it are error), since the hub started.
	BeginsDropped uint64 `json:"begins_dropped"`
}

// HubStatus is the hub's state for status and /metrics.
type HubStatus struct {
	Rings []RingStatus `json:"rings"` // the live workers' rings
	// Totals count every ring since the hub started, those of workers gone included
	// (Occupancy: the most of any live ring).
	Totals    RingStats        `json:"totals"`
	Consumers []ConsumerStatus `json:"consumers"`
}

// Status reads the rings' counters and each consumer's slots.
func (h *Hub) Status() HubStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := HubStatus{Rings: []RingStatus{}, Consumers: []ConsumerStatus{}}
	ids := make([]uint32, 0, len(h.rings))
	for id := range h.rings {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	slotsOf := map[uint32][]SlotStats{}
	for _, id := range ids {
		r := h.rings[id]
		rs := r.r.Stats()
		st.Rings = append(st.Rings, RingStatus{ID: id, WorkerPID: r.worker.pid, Capacity: r.r.cap, RingStats: rs})
		slotsOf[id] = r.r.Slots()
		st.Totals.Records += rs.Records
		st.Totals.Bytes += rs.Bytes
		st.Totals.Dropped += rs.Dropped
		st.Totals.Reclaimed += rs.Reclaimed
		st.Totals.Occupancy = max(st.Totals.Occupancy, rs.Occupancy)
	}
	st.Totals.Records += h.goneRings.Records
	st.Totals.Bytes += h.goneRings.Bytes
	st.Totals.Dropped += h.goneRings.Dropped
	st.Totals.Reclaimed += h.goneRings.Reclaimed
	for _, name := range h.Consumers() {
		g := h.goneCons[name]
		cs := ConsumerStatus{Name: name, Type: h.consumers[name], Received: g.received, Dropped: g.dropped, Disconnects: h.disconnects[name],
			BeginsDropped: h.beginsDropped[name]}
		if c := h.live[name]; c != nil {
			cs.Attached, cs.PID = true, c.pid
			cs.Queued = c.out.queued()
			for _, s := range c.slots {
				ss, ok := slotsOf[s.ring]
				if !ok || s.slot >= len(ss) || !ss[s.slot].Attached || ss[s.slot].PID != s.pid {
					continue
				}
				cs.Rings++
				cs.Received += ss[s.slot].Received
				cs.Dropped += ss[s.slot].Dropped
				cs.Lag = max(cs.Lag, ss[s.slot].Lag)
			}
		}
		for _, q := range h.reqs {
			if r := q.results[name]; r != nil && r.Status == StatusPending {
				cs.Pending++
			}
		}
		st.Consumers = append(st.Consumers, cs)
	}
	return st
}

// Close stops serving: connections close, rings unmap.
func (h *Hub) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.ln.Close()
	for c := range h.conns {
		c.c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, r := range h.rings {
		r.r.Close()
		delete(h.rings, id)
	}
	return nil
}
