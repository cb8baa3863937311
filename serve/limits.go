package serve

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrBusy means the request bodies in flight already hold the bytes serve allows at once (in
// total, max_inflight_body_bytes, or for this key's tenant, max_tenant_body_bytes): the body
// was not read; retry after the Retry-After seconds, or raise the limit.
var ErrBusy = errors.New("shmsteer: too many request body bytes in flight")

// fdReserve is how many file descriptors the connection cap leaves to everything but HTTP:
// the ipc owner's listener and one socket per attached worker, the region's memfds, the state
// directory's files during a save, the mirror's connection.
const fdReserve = 256

// connCap returns the HTTP connection cap: max_connections, lowered so that fdReserve
// descriptors stay free under RLIMIT_NOFILE's soft limit. An error if fewer than 16 are left.
func connCap(maxConns int) (int, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return maxConns, nil
	}
	n := maxConns
	if rl.Cur != unix.RLIM_INFINITY && rl.Cur < uint64(maxConns+fdReserve) {
		n = int(rl.Cur) - fdReserve
	}
	if n < 16 {
		return 0, fmt.Errorf("%w: the file descriptor limit (ulimit -n) is %d: serve keeps %d for workers and state and needs 16 more for HTTP; raise it", ErrConfig, rl.Cur, fdReserve)
	}
	return n, nil
}

// connLimiter caps the connections a listener has open. When the cap is reached, Accept first
// closes the connection that has been idle (keep-alive between requests, or opened with no
// request yet) the longest; with none idle it waits for a connection to close. Connections
// beyond the cap wait in the kernel's accept queue (one in Accept) and hold no descriptor.
// ConnState must be the http.Server's ConnState hook.
type connLimiter struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	once  sync.Once

	mu   sync.Mutex
	idle map[*limitedConn]time.Time // since when each idle connection has been idle
}

func newConnLimiter(ln net.Listener, n int) *connLimiter {
	return &connLimiter{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{}), idle: map[*limitedConn]time.Time{}}
}

func (l *connLimiter) Accept() (net.Conn, error) {
	// Accept first, so that an idle connection is closed only for one that is waiting (the
	// waiting one holds one descriptor beyond the cap).
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	select {
	case l.slots <- struct{}{}:
	default:
		l.evictIdle()
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			c.Close()
			return nil, net.ErrClosed
		}
	}
	lc := &limitedConn{Conn: c, l: l}
	l.setIdle(lc, true) // no request yet: the first to go if the cap is reached
	return lc, nil
}

func (l *connLimiter) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// evictIdle closes the longest-idle connection, if any.
func (l *connLimiter) evictIdle() {
	l.mu.Lock()
	var oldest *limitedConn
	var since time.Time
	for c, t := range l.idle {
		if oldest == nil || t.Before(since) {
			oldest, since = c, t
		}
	}
	if oldest != nil {
		delete(l.idle, oldest)
	}
	l.mu.Unlock()
	if oldest != nil {
		oldest.Close()
	}
}

func (l *connLimiter) setIdle(c *limitedConn, idle bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if idle {
		l.idle[c] = time.Now()
	} else {
		delete(l.idle, c)
	}
}

// ConnState tracks which connections are idle (http.Server.ConnState).
func (l *connLimiter) ConnState(c net.Conn, st http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateIdle:
		l.setIdle(lc, true)
	case http.StateActive, http.StateHijacked, http.StateClosed:
		l.setIdle(lc, false)
	}
}

// limitedConn gives its slot back when closed.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.setIdle(c, false)
		<-c.l.slots
	})
	return err
}

// smallBody is how much of each request body is not charged to the bodyBudget, so that
// control calls go on while large uploads hold the budget; the connection cap bounds what
// small bodies can add up to (max_connections × smallBody).
const smallBody = 64 << 10

// bodyBudget bounds the bytes of request bodies held at once, in total and per tenant (the
// unscoped admin keys, tenant "", are bound by the total only), so that concurrent large
// bodies cannot add up to more memory than configured. A body holds its bytes until its handler returns, since what
// is decoded from it lives as long.
type bodyBudget struct {
	max, tenantMax int64

	mu     sync.Mutex
	total  int64
	tenant map[string]int64
}

func newBodyBudget(max, tenantMax int64) *bodyBudget {
	return &bodyBudget{max: max, tenantMax: tenantMax, tenant: map[string]int64{}}
}

// take reserves n bytes for tenant, or returns an error and reserves nothing: ErrBusy if they
// do not fit now, a 413 (http.MaxBytesError) if they never could.
func (b *bodyBudget) take(tenant string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	tenantMax := b.tenantMax
	if tenant == "" {
		tenantMax = b.max
	}
	switch {
	case n > tenantMax:
		return fmt.Errorf("shmsteer: request body larger than this key may send at once (max_tenant_body_bytes %d, max_inflight_body_bytes %d): send less: %w",
			b.tenantMax, b.max, &http.MaxBytesError{Limit: tenantMax})
	case b.total+n > b.max:
		return fmt.Errorf("%w: %d bytes of bodies are being read and this one needs %d more; the limit is %d (max_inflight_body_bytes): retry later", ErrBusy, b.total, n, b.max)
	case b.tenant[tenant]+n > tenantMax:
		return fmt.Errorf("%w: this key's tenant has %d bytes of bodies being read and this one needs %d more; the limit is %d (max_tenant_body_bytes): retry later", ErrBusy, b.tenant[tenant], n, b.tenantMax)
	}
	b.total += n
	b.tenant[tenant] += n
	return nil
}

func (b *bodyBudget) give(tenant string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total -= n
	if b.tenant[tenant] -= n; b.tenant[tenant] == 0 {
		delete(b.tenant, tenant)
	}
}

// budgetedBody is a request body charged to a bodyBudget beyond its first smallBody bytes: a
// declared length up front (before a byte is read), else each chunk as it is read. release
// gives the bytes back once the handler is done with what it decoded from them.
type budgetedBody struct {
	io.ReadCloser
	b        *bodyBudget
	tenant   string
	declared bool
	read     int64 // bytes read (undeclared length)
	held     int64
}

// charge wraps r's body; an error (ErrBusy, or a 413) if its declared length does not fit.
func (b *bodyBudget) charge(r *http.Request, tenant string) (*budgetedBody, error) {
	bb := &budgetedBody{ReadCloser: r.Body, b: b, tenant: tenant, declared: r.ContentLength >= 0}
	if n := r.ContentLength - smallBody; n > 0 {
		if err := b.take(tenant, n); err != nil {
			return nil, err
		}
		bb.held = n
	}
	return bb, nil
}

func (bb *budgetedBody) Read(p []byte) (int, error) {
	n, err := bb.ReadCloser.Read(p)
	if n > 0 && !bb.declared {
		bb.read += int64(n)
		if more := bb.read - smallBody - bb.held; more > 0 {
			if terr := bb.b.take(bb.tenant, more); terr != nil {
				return 0, terr
			}
			bb.held += more
		}
	}
	return n, err
}

func (bb *budgetedBody) release() {
	bb.b.give(bb.tenant, bb.held)
	bb.held = 0
}

// readBody reads a JSON call's body (at most max_body_bytes) charged to the body budget; the
// caller calls release when it is done with what it decoded from the body.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, p principal) (body []byte, release func(), err error) {
	release = func() {}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, release, fmt.Errorf("shmsteer: request body of %d bytes, max_body_bytes is %d: %w", r.ContentLength, s.cfg.MaxBodyBytes, &http.MaxBytesError{Limit: s.cfg.MaxBodyBytes})
	}
	bb, err := s.bodies.charge(r, p.tenant)
	if err != nil {
		return nil, release, err
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + 1) // one read past it sees EOF; no doubling copies
	}
	_, err = buf.ReadFrom(http.MaxBytesReader(w, bb, s.cfg.MaxBodyBytes))
	return buf.Bytes(), bb.release, err
}
