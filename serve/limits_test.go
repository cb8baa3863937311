package serve

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The body budget: a declared length is charged up front beyond the free 64 KiB, an
// undeclared one as it is read; the total and per-tenant bounds refuse with ErrBusy what does
// not fit now and with a 413 what never could; admin keys (tenant "") have the total only;
// release gives everything back.
func TestBodyBudget(t *testing.T) {
	b := newBodyBudget(1<<20, 512<<10)
	req := func(n int64, chunked bool) *http.Request {
		r, _ := http.NewRequest("POST", "/", io.LimitReader(zeros{}, n))
		r.ContentLength = n
		if chunked {
			r.ContentLength = -1
		}
		return r
	}
	small, err := b.charge(req(smallBody, false), "a")
	require.NoError(t, err)
	require.Zero(t, small.held, "the first 64 KiB are free")
	x, err := b.charge(req(smallBody+400<<10, false), "a")
	require.NoError(t, err)
	_, err = b.charge(req(smallBody+200<<10, false), "a")
	require.ErrorIs(t, err, ErrBusy, "tenant a is at 400 KiB of 512")
	require.Contains(t, err.Error(), "max_tenant_body_bytes")
	_, err = b.charge(req(smallBody+600<<10, false), "b")
	var mbe *http.MaxBytesError
	require.True(t, errors.As(err, &mbe), "more than a tenant may ever send: %v", err)
	admin, err := b.charge(req(smallBody+600<<10, false), "")
	require.NoError(t, err, "admin keys: the total bound only")
	_, err = b.charge(req(smallBody+100<<10, false), "b")
	require.ErrorIs(t, err, ErrBusy, "the total is at 1000 KiB of 1024")
	require.Contains(t, err.Error(), "max_inflight_body_bytes")

	// Undeclared length: charged as read, refused mid-body when it stops fitting.
	c, err := b.charge(req(smallBody+100<<10, true), "b")
	require.NoError(t, err)
	_, err = io.ReadAll(c)
	require.ErrorIs(t, err, ErrBusy)
	c.release()
	x.release()
	admin.release()
	c, err = b.charge(req(smallBody+100<<10, true), "b")
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, c)
	require.NoError(t, err)
	require.EqualValues(t, smallBody+100<<10, n)
	require.EqualValues(t, 100<<10, c.held)
	c.release()
	small.release()
	require.Zero(t, b.total)
	require.Empty(t, b.tenant)
}

// The connection limiter: at the cap, Accept closes the longest-idle connection to make room;
// with none idle it waits until one closes.
func TestConnLimiter(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := newConnLimiter(ln, 2)
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	next := func() net.Conn {
		select {
		case c := <-accepted:
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("not accepted")
			return nil
		}
	}
	c1 := dial()
	next() // stays idle (no request yet)
	dial()
	s2 := next()
	l.ConnState(s2, http.StateActive)
	dial()
	s3 := next()
	c1.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c1.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the idle connection was closed to make room")
	l.ConnState(s3, http.StateActive)
	dial()
	select {
	case <-accepted:
		t.Fatal("accepted beyond the cap with no idle connection")
	case <-time.After(200 * time.Millisecond):
	}
	s2.Close()
	next()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
