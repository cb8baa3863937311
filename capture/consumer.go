//go:build linux

package capture

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
)

// ConsumerOptions configure AttachConsumer and NewConsumer.
type ConsumerOptions struct {
	// Name is the consumer's name, one the owner declares (ErrUnknownConsumer otherwise).
	Name string
	// Policy is the consumer's backpressure policy on every ring: Block (a worker waits for it
	// up to Bound, then drops the record) or Drop (the worker drops at once). 0 means Block.
	Policy Policy
	// Bound is how long a worker's append may wait for this consumer (Block), at most the
	// worker's own bound; 0 means the worker's.
	Bound time.Duration
	// Namespace, Secret and SecretFile find and prove the owner (AttachConsumer only; as in
	// ipc.ClientOptions).
	Namespace  string
	Secret     *ipc.Secret
	SecretFile string
}

// EventKind says what an Event carries.
type EventKind uint8

const (
	// EventBegin: a request captured for this consumer was admitted (RequestID, Spec,
	// PromptLen). It comes before any record of the request.
	EventBegin EventKind = 1
	// EventRecord: one site's rows of one request in one step (Record, a view of the ring).
	EventRecord EventKind = 2
	// EventEnd: the request ended and every one of its records was delivered before (Dropped
	// counts the records dropped for this consumer while the request was open).
	EventEnd EventKind = 3
)

// Event is one item of a consumer's stream (Consumer.Next).
type Event struct {
	Kind      EventKind
	RequestID string
	Spec      json.RawMessage // EventBegin: this consumer's spec for the request
	PromptLen int             // EventBegin
	Record    RingRecord      // EventRecord: Data is a view of the ring, valid until the next Next or Release
	Ring      uint32          // EventRecord: the ring (worker) it came from
	Dropped   uint64          // EventEnd
}

// Consumer is one attached consumer: it reads every worker's ring through its own slot and
// receives the owner's begin and end notices. One goroutine at a time.
type Consumer struct {
	opts      ConsumerOptions
	link      *hubLink
	client    *ipc.Client // AttachConsumer's, closed by Close
	rings     []*consRing
	begun     map[string]begunReq // request id → its begin
	queued    []Event             // begin notices not yet delivered
	ends      []pendingEnd
	rr        int
	last      *consRing // the ring whose record Next returned last
	err       error     // the hub is gone: Next returns it once the rings are drained
	synced    bool      // the hub's initial ring list is in
	sincePump int       // events since the connection was last read
	hold      bool      // NextBatch: records read without releasing those before
	// Next's read-ahead: records read (held) at once and delivered one a call; aheadErr is
	// the error that ended the run, returned once the run is delivered.
	ahead    []Event
	aheadAt  int
	aheadErr error
	// Skipped counts records of requests not captured for this consumer (released unread).
	skipped uint64
}

// begunReq is a request begun for this consumer: its id (the string every record of it
// carries) and the consumer's dropped count at its begin.
type begunReq struct {
	id      string
	dropped uint64
}

type consRing struct {
	id   uint32
	r    *Ring
	rd   *RingReader
	gone bool // its worker left: drained, then closed
}

type pendingEnd struct {
	id    string
	marks map[uint32]uint64 // ring id → its write position when the end notice was read
}

// AttachConsumer attaches to the owner (ipc.Attach with the options' namespace and secret)
// and registers as consumer opts.Name.
func AttachConsumer(opts ConsumerOptions) (*Consumer, error) {
	cl, err := ipc.Attach(ipc.ClientOptions{Namespace: opts.Namespace, Secret: opts.Secret, SecretFile: opts.SecretFile})
	if err != nil {
		return nil, err
	}
	c, err := NewConsumer(cl, opts)
	if err != nil {
		cl.Close()
		return nil, err
	}
	c.client = cl
	return c, nil
}

// NewConsumer registers as consumer opts.Name over an attached client c (the owner's RPCs):
// ErrUnknownConsumer, ErrConsumerTaken, ErrNoHub, ErrBadPolicy.
func NewConsumer(c steer.Caller, opts ConsumerOptions) (*Consumer, error) {
	if opts.Policy == 0 {
		opts.Policy = Block
	}
	if (opts.Policy != Block && opts.Policy != Drop) || opts.Bound < 0 {
		return nil, fmt.Errorf("%w: policy %d, bound %v", ErrBadPolicy, opts.Policy, opts.Bound)
	}
	if err := checkConsumerName(opts.Name); err != nil {
		return nil, err
	}
	link, err := dialHub(c, roleConsumer, opts.Name)
	if err != nil {
		return nil, err
	}
	k := &Consumer{opts: opts, link: link, begun: map[string]begunReq{}}
	// The rings that exist come right after the welcome, then synced: attached to each of
	// them when NewConsumer returns.
	for deadline := time.Now().Add(5 * time.Second); !k.synced; {
		if err := k.pump(); err != nil {
			k.Close()
			return nil, err
		}
		if k.err != nil || time.Now().After(deadline) {
			k.Close()
			return nil, fmt.Errorf("%w: no ring list from the hub (%v)", ErrHubGone, k.err)
		}
		if !k.synced {
			link.recvWait(10 * time.Millisecond)
		}
	}
	return k, nil
}

// Name is the consumer's name.
func (c *Consumer) Name() string { return c.opts.Name }

// pump reads every notice already in the connection, without waiting.
func (c *Consumer) pump() error {
	if c.err != nil {
		return nil
	}
	for {
		m, err := c.link.recv(0)
		if err != nil {
			c.err = err
			return nil
		}
		switch m.typ {
		case 0:
			return nil
		case msgSynced:
			c.synced = true
		case msgRing:
			fd, ok := c.link.takeFd()
			if !ok {
				return fmt.Errorf("%w: a ring notice without its memfd", ErrHubProtocol)
			}
			err := c.addRing(m.ring, fd)
			closeFd(fd)
			if err != nil {
				return err
			}
		case msgRingGone:
			for _, r := range c.rings {
				if r.id == m.ring {
					r.gone = true
				}
			}
		case msgBegin:
			c.begun[m.id] = begunReq{id: m.id, dropped: c.dropped()}
			c.queued = append(c.queued, Event{Kind: EventBegin, RequestID: m.id, Spec: json.RawMessage(m.spec), PromptLen: int(m.prompt)})
		case msgEnd:
			pe := pendingEnd{id: m.id, marks: map[uint32]uint64{}}
			for _, r := range c.rings {
				pe.marks[r.id] = r.r.writePos()
			}
			c.ends = append(c.ends, pe)
		default:
			return fmt.Errorf("%w: message type %d to a consumer", ErrHubProtocol, m.typ)
		}
	}
}

func (c *Consumer) addRing(id uint32, fd int) error {
	r, err := OpenRing(fd)
	if err != nil {
		return err
	}
	rd, err := r.AttachBound(c.opts.Policy, c.opts.Bound)
	if err != nil {
		r.Close()
		return err
	}
	rd.scratch.begun = c.begunID
	c.rings = append(c.rings, &consRing{id: id, r: r, rd: rd})
	return c.link.send(encodeHubMsg(nil, hubMsg{typ: msgSlot, ring: id, slot: uint32(rd.Slot()), pid: uint32(os.Getpid())}), nil)
}

// begunID is the id of the request begun for this consumer whose id's bytes are b (the reader
// takes it for the record it decodes: one lookup tells both the request's string and whether
// it is captured for this consumer).
func (c *Consumer) begunID(b []byte) (string, bool) {
	r, ok := c.begun[string(b)]
	return r.id, ok
}

// dropped sums the records dropped for this consumer on every ring.
func (c *Consumer) dropped() uint64 {
	var n uint64
	for _, r := range c.rings {
		n += r.rd.Dropped()
	}
	return n
}

// Release lets the worker reuse the records Next and NextBatch returned (they do it too). While
// records Next read ahead are undelivered it does nothing: they, and those returned before
// them, are released once the run is delivered.
func (c *Consumer) Release() {
	if c.aheadAt < len(c.ahead) {
		return
	}
	for _, r := range c.rings {
		r.rd.Release()
	}
	c.last = nil
}

// NextBatch is Next for up to n events at once, appended to dst: the first as Next returns
// it, then, if it is a record, the records that follow it in its ring (until n, a begin
// notice or none left). Every record's views stay valid until the next Next, NextBatch or Release (the
// worker cannot reuse their space meanwhile: keep batches small against the ring).
func (c *Consumer) NextBatch(dst []Event, n int, wait time.Duration) ([]Event, error) {
	return c.run(dst, RunOptions{Max: min(MaxRun, max(1, n))}, false, wait)
}

// takeAhead marks the next n read-ahead events delivered.
func (c *Consumer) takeAhead(n int) {
	clear(c.ahead[c.aheadAt : c.aheadAt+n])
	c.aheadAt += n
	if c.aheadAt == len(c.ahead) {
		c.ahead, c.aheadAt = c.ahead[:0], 0
	}
}

// pumpEvery bounds the events Next returns between two reads of the hub's connection.
const pumpEvery = 64

// readAhead is the most records Next reads at once (as NextBatch does) and then returns one
// a call: a consumer that decodes each frame's header between its copies of the records' data
// reads at about two thirds of the bandwidth of one that decodes a run of headers and then
// copies their data back to back (BenchmarkConsumerRead, before and after).
const readAhead = 64

// Next returns the next event, waiting at most wait (false: none came): a request's begin
// before its records, its end after all of them. Records of requests not captured for this
// consumer are skipped. ErrHubGone once the owner's hub closed the connection and the rings
// are drained; ErrRingCorrupt from a ring. A record's views stay valid at least until the next
// Next, NextBatch or Release (records Next read ahead are released together, once all of them
// are returned).
func (c *Consumer) Next(wait time.Duration) (Event, bool, error) {
	if c.aheadAt < len(c.ahead) {
		ev := c.ahead[c.aheadAt]
		c.takeAhead(1)
		return ev, true, nil
	}
	if err := c.aheadErr; err != nil {
		c.aheadErr = nil
		return Event{}, false, err
	}
	evs, err := c.nextRun(c.ahead[:0], RunOptions{Max: readAhead}, false, wait)
	if len(evs) == 0 {
		return Event{}, false, err
	}
	c.ahead, c.aheadAt, c.aheadErr = evs, 0, err
	ev := c.ahead[0]
	c.takeAhead(1)
	return ev, true, nil
}

// next is Next without the read-ahead: the next event alone.
func (c *Consumer) next(wait time.Duration) (Event, bool, error) {
	c.Release()
	var deadline time.Time // set once nothing came (not a clock read a record)
	for idle := 0; ; idle++ {
		// The connection is read when records run out, for a record of a request not yet
		// begun, and every pumpEvery events meanwhile (so an end notice is not held back by
		// a ring that never empties): a read per record would cost a syscall each.
		if idle > 0 || c.sincePump >= pumpEvery {
			c.sincePump = 0
			if err := c.pump(); err != nil {
				return Event{}, false, err
			}
		}
		c.sincePump++
		if len(c.queued) > 0 {
			ev := c.queued[0]
			c.queued = c.queued[1:]
			return ev, true, nil
		}
		if ev, ok := c.nextEnd(); ok {
			return ev, true, nil
		}
		ev, ok, err := c.nextRecord()
		if err != nil || ok {
			return ev, ok, err
		}
		if c.err != nil && len(c.ends) == 0 {
			return Event{}, false, c.err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(wait)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return Event{}, false, nil
		}
		// Nothing yet: spin briefly, then sleep on the connection (notices wake it; records
		// are polled).
		if idle < 64 {
			continue
		}
		c.link.recvWait(min(left, time.Millisecond))
	}
}

// nextEnd delivers the first pending end whose records have all been read.
func (c *Consumer) nextEnd() (Event, bool) {
	for i, pe := range c.ends {
		done := true
		for _, r := range c.rings {
			// A ring whose worker left still counts until it is drained (then removed).
			if mark, ok := pe.marks[r.id]; ok && !r.rd.caughtUp(mark) {
				done = false
			}
		}
		if done {
			c.ends = slices.Delete(c.ends, i, i+1)
			ev := Event{Kind: EventEnd, RequestID: pe.id}
			if at, ok := c.begun[pe.id]; ok {
				ev.Dropped = c.dropped() - at.dropped
				delete(c.begun, pe.id)
			}
			return ev, true
		}
	}
	return Event{}, false
}

func (c *Consumer) nextRecord() (Event, bool, error) {
	var ev Event
	for range len(c.rings) {
		if len(c.rings) == 0 {
			break
		}
		c.rr = (c.rr + 1) % len(c.rings)
		ok, err := c.ringRecord(c.rr, &ev)
		if err != nil || ok || len(c.queued) > 0 {
			return ev, ok, err
		}
	}
	return Event{}, false, nil
}

// ringRecord decodes into *ev the next record of ring c.rings[i] captured for this consumer
// (false: none yet, or a begin notice is queued to go first; *ev is then not an event).
func (c *Consumer) ringRecord(i int, ev *Event) (bool, error) {
	r := c.rings[i]
	rec := &ev.Record
	for {
		if !c.hold {
			r.rd.Release()
		}
		ok, err := r.rd.next(rec)
		if err != nil || !ok {
			if err == nil && r.gone && !c.hold { // held records may be views into its mapping
				c.removeRing(i)
			}
			return false, err
		}
		if !rec.begun { // the reader found no begin for it (Consumer.begunID)
			// Its begin notice, if any, is in the connection already (the owner sends it
			// before the admission returns, so before any step).
			if err := c.pump(); err != nil {
				return false, err
			}
			if len(c.queued) > 0 {
				// Deliver the begin first; this record is read again after it.
				r.rd.unread()
				return false, nil
			}
			if _, mine := c.begun[rec.RequestID]; !mine {
				c.skipped++
				if !c.hold { // held: released with the batch
					r.rd.Release()
				}
				continue
			}
		}
		c.last = r
		ev.Kind, ev.RequestID, ev.Ring = EventRecord, rec.RequestID, r.id
		return true, nil
	}
}

func (c *Consumer) removeRing(i int) {
	r := c.rings[i]
	r.rd.Detach()
	r.r.Close()
	c.rings = slices.Delete(c.rings, i, i+1)
	if c.last == r {
		c.last = nil
	}
}

// Publish sends the consumer's result for a request (after its EventEnd): ErrBadResult for a
// status other than ok, partial_error or error or a payload that is not a JSON array.
func (c *Consumer) Publish(requestID string, r Result) error {
	if r.Status < StatusOK || r.Status > StatusError || requestID == "" || len(requestID) > math.MaxUint16 {
		return fmt.Errorf("%w: status %v for request id of %d bytes", ErrBadResult, r.Status, len(requestID))
	}
	if err := checkPayload(r.Payload); err != nil {
		return err
	}
	msg := encodeHubMsg(nil, hubMsg{typ: msgResult, status: r.Status, id: requestID, message: r.Error, spec: r.Payload})
	if len(msg) > maxHubMsg {
		return fmt.Errorf("%w: a %d-byte result, at most %d", ErrBadResult, len(msg), maxHubMsg)
	}
	return c.link.send(msg, nil)
}

// RingData is the data area of ring id as this consumer maps it (nil if it reads no such
// ring): a record's Data and PositionsLE are views inside it, which lets a reader that takes
// no copy (the C ABI) name them by offset. Valid until the ring goes (its worker left).
func (c *Consumer) RingData(id uint32) []byte {
	for _, r := range c.rings {
		if r.id == id {
			return r.r.data
		}
	}
	return nil
}

// ConsumerStats are a consumer's counters over its rings.
type ConsumerStats struct {
	Rings    int
	Received uint64 // records read
	Dropped  uint64 // records dropped while it lagged
	Skipped  uint64 // records of requests not captured for it
	Lag      uint64 // the most bytes it has not released on any ring
}

// Stats reads the consumer's counters.
func (c *Consumer) Stats() ConsumerStats {
	s := ConsumerStats{Rings: len(c.rings), Skipped: c.skipped}
	for _, r := range c.rings {
		s.Received += r.rd.Received()
		s.Dropped += r.rd.Dropped()
		for _, ss := range r.r.Slots() {
			if ss.Slot == r.rd.Slot() {
				s.Lag = max(s.Lag, ss.Lag)
			}
		}
	}
	return s
}

// Close detaches from every ring and leaves the hub (its pending requests end with status
// error unless it published).
func (c *Consumer) Close() error {
	c.last = nil
	c.ahead, c.aheadAt, c.aheadErr = nil, 0, nil
	for _, r := range c.rings {
		r.rd.Detach()
		r.r.Close()
	}
	c.rings = nil
	c.link.close()
	if c.client != nil {
		return c.client.Close()
	}
	return nil
}
