package ipc

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/stretchr/testify/require"
)

func TestAttachReadWrite(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	require.NoError(t, ownerStore(o).Set("req-1", []byte("key-one")))

	c := attach(t, env.clientOpts())
	require.Equal(t, 1, o.Clients())
	got, err := clientStore(c).Get("req-1", nil)
	require.NoError(t, err)
	require.Equal(t, "key-one", string(got))

	require.NoError(t, clientStore(c).Set("req-2", []byte("key-two")))
	got, err = ownerStore(o).Get("req-2", []byte("prefix:"))
	require.NoError(t, err)
	require.Equal(t, "prefix:key-two", string(got))

	_, err = c.Region().Put(storeKind, "x", []byte{1})
	require.ErrorIs(t, err, shm.ErrReadOnly, "a client's region is read-only")

	n, err := clientStore(c).Len()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.NoError(t, c.Ping())

	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Close(), ErrClosed)
	require.Eventually(t, func() bool { return o.Clients() == 0 }, 10*time.Second, time.Millisecond)
}

var errTestSentinel = errors.New("shmsteer: test sentinel")

func init() { RegisterError(4000, errTestSentinel) }

func TestExtensionOps(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	o.Handle(300, func(req []byte) ([]byte, error) { return append([]byte("echo:"), req...), nil })
	o.Handle(301, func(req []byte) ([]byte, error) { return nil, fmt.Errorf("vector %q: %w", req, errTestSentinel) })
	o.Handle(302, func(req []byte) ([]byte, error) { panic("boom") })
	o.Handle(303, func(req []byte) ([]byte, error) { return nil, fmt.Errorf("full: %w", shm.ErrRegionFull) })
	big := bytes.Repeat([]byte{1}, 3<<20)
	o.Handle(304, func(req []byte) ([]byte, error) {
		if !bytes.Equal(req, big) {
			return nil, errors.New("big request corrupted")
		}
		return req, nil
	})
	require.Panics(t, func() { o.Handle(10, func([]byte) ([]byte, error) { return nil, nil }) })
	require.Panics(t, func() { RegisterError(4000, errors.New("dup")) })
	require.Panics(t, func() { RegisterError(5, errors.New("reserved")) })

	c := attach(t, env.clientOpts())
	got, err := c.Call(300, []byte("hi"))
	require.NoError(t, err)
	require.Equal(t, "echo:hi", string(got))

	_, err = c.Call(301, []byte("v1"))
	require.ErrorIs(t, err, errTestSentinel)
	require.Contains(t, err.Error(), `vector "v1"`)
	var re *RemoteError
	require.ErrorAs(t, err, &re)
	require.Equal(t, uint16(4000), re.Code)

	_, err = c.Call(302, nil)
	require.ErrorContains(t, err, "panicked")
	_, err = c.Call(303, nil)
	require.ErrorIs(t, err, shm.ErrRegionFull)
	_, err = c.Call(999, nil)
	require.ErrorIs(t, err, ErrUnknownOp)
	_, err = c.Call(18, nil)
	require.ErrorIs(t, err, ErrUnknownOp, "reserved ops are not callable")

	got, err = c.Call(304, big)
	require.NoError(t, err)
	require.Equal(t, big, got)
	_, err = c.Call(300, make([]byte, DefaultMaxFrameBytes))
	require.ErrorIs(t, err, ErrFrameTooLarge)
	require.NoError(t, c.Ping(), "the connection survives")
}

func TestConcurrentClients(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	c := attach(t, env.clientOpts())
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				id := fmt.Sprintf("g%d-%d", g, i)
				if err := clientStore(c).Set(id, []byte(id)); err != nil {
					t.Error(err)
					return
				}
				got, err := clientStore(c).Get(id, nil)
				if err != nil || string(got) != id {
					t.Error("read back", id, string(got), err)
					return
				}
			}
		})
	}
	wg.Wait()
	n, err := ownerStore(o).Len()
	require.NoError(t, err)
	require.Equal(t, 200, n)
}

func TestSecondOwnerInProcess(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	_, err := NewOwner(env.ownerOpts())
	require.ErrorIs(t, err, ErrPreviouslyInitialized)
	other := env.ownerOpts()
	other.Namespace += "-other"
	o2 := newTestOwner(t, other)
	require.NotEqual(t, o.handle, o2.handle)
	require.NoError(t, o.Close())
	o3 := newTestOwner(t, env.ownerOpts()) // the handle is free again
	require.NoError(t, o3.Close())
}

func TestAttachErrors(t *testing.T) {
	env := newTestEnv()
	_, err := Attach(env.clientOpts())
	require.ErrorIs(t, err, ErrNotYetInitialized)

	t.Setenv(SecretEnv, "")
	_, err = Attach(ClientOptions{Namespace: env.ns})
	require.ErrorIs(t, err, ErrAuthSecretNotDefined)
	_, err = NewOwner(OwnerOptions{Namespace: env.ns})
	require.ErrorIs(t, err, ErrAuthSecretNotDefined)
	empty := NewSecret(nil)
	_, err = NewOwner(OwnerOptions{Secret: &empty})
	require.ErrorIs(t, err, ErrAuthSecretNotDefined)

	o := newTestOwner(t, env.ownerOpts())
	// An impostor that found the socket (it is listed in /proc/net/unix) but has another secret.
	wrong := NewSecret([]byte("wrong"))
	opts := ClientOptions{Secret: &wrong, Namespace: env.ns, handle: o.handle}
	_, err = Attach(opts)
	require.ErrorIs(t, err, ErrAuthFailed)
	// A wrong secret finds no handle, knocks at the namespace's lobby and fails the handshake.
	_, err = Attach(ClientOptions{Secret: &wrong, Namespace: env.ns})
	require.ErrorIs(t, err, ErrAuthFailed)
	// A second owner of the namespace with another secret is refused.
	_, err = NewOwner(OwnerOptions{Secret: &wrong, Namespace: env.ns})
	require.ErrorIs(t, err, ErrPreviouslyInitialized)
	// The right secret with another namespace finds no owner.
	_, err = Attach(ClientOptions{Secret: &env.secret, Namespace: env.ns + "x"})
	require.ErrorIs(t, err, ErrNotYetInitialized)
	// The right secret at the right handle but proving another namespace fails.
	_, err = Attach(ClientOptions{Secret: &env.secret, Namespace: env.ns + "x", handle: o.handle})
	require.ErrorIs(t, err, ErrAuthFailed)
	require.Zero(t, o.Clients())
}

func TestDropEnv(t *testing.T) {
	env := newTestEnv()
	t.Setenv(SecretEnv, env.secretStr)
	o := newTestOwner(t, OwnerOptions{Namespace: env.ns, Region: testRegion, DropEnv: true, Logger: quietLogger()})
	_, set := lookupEnv(SecretEnv)
	require.False(t, set)
	c := attach(t, env.clientOpts())
	require.NoError(t, ownerStore(o).Set("a", []byte("b")))
	got, err := clientStore(c).Get("a", nil)
	require.NoError(t, err)
	require.Equal(t, "b", string(got))
}

// dialRaw dials an owner's handle for protocol-level tests.
func dialRaw(t *testing.T, handle string) *net.UnixConn {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: "@" + handle, Net: "unix"})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func readFrame(t *testing.T, c *net.UnixConn, fr *frameReader) frame {
	f, err := fr.next(c.Read, DefaultMaxFrameBytes)
	require.NoError(t, err)
	return f
}

func TestReplayedHandshakeFails(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	nonce := bytes.Repeat([]byte{9}, nonceLen)
	hello := appendFrame(nil, opHello, 0, encodeHello(nonce))

	// A genuine handshake, recorded.
	c1 := dialRaw(t, o.handle)
	var fr1 frameReader
	_, err := c1.Write(hello)
	require.NoError(t, err)
	f := readFrame(t, c1, &fr1)
	require.Equal(t, opChallenge, f.op)
	on, _, err := decodeChallenge(f.payload)
	require.NoError(t, err)
	p := proof(env.secret, clientProofLabel, env.ns, nonce, on)
	recorded := appendFrame(nil, opProof, 0, p[:])
	_, err = c1.Write(recorded)
	require.NoError(t, err)
	f = readFrame(t, c1, &fr1)
	require.Equal(t, opWelcome, f.op)

	// Replayed on a new connection: the owner's nonce is fresh, so the proof is stale.
	c2 := dialRaw(t, o.handle)
	var fr2 frameReader
	_, err = c2.Write(hello)
	require.NoError(t, err)
	f = readFrame(t, c2, &fr2)
	require.Equal(t, opChallenge, f.op)
	_, err = c2.Write(recorded)
	require.NoError(t, err)
	f = readFrame(t, c2, &fr2)
	require.Equal(t, opError, f.op)
	code, _, err := decodeError(f.payload)
	require.NoError(t, err)
	require.Equal(t, codeAuthFailed, code)
}

func TestIncompatibleProtocol(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	c := dialRaw(t, o.handle)
	hello := encodeHello(make([]byte, nonceLen))
	hello[0] = protoVersion + 1
	_, err := c.Write(appendFrame(nil, opHello, 0, hello))
	require.NoError(t, err)
	var fr frameReader
	f := readFrame(t, c, &fr)
	require.Equal(t, opError, f.op)
	code, msg, err := decodeError(f.payload)
	require.NoError(t, err)
	err = remoteError(code, msg)
	require.ErrorIs(t, err, ErrIncompatible)
	require.ErrorIs(t, err, shm.ErrIncompatible)

	// And a client seeing a newer owner's challenge.
	_, _, err = decodeChallenge([]byte{protoVersion + 1, 1, 2})
	require.ErrorIs(t, err, ErrIncompatible)
}

func TestOwnerCloseMeansOwnerGone(t *testing.T) {
	env := newTestEnv()
	o, err := NewOwner(env.ownerOpts())
	require.NoError(t, err)
	require.NoError(t, ownerStore(o).Set("k", []byte("v")))
	c := attach(t, env.clientOpts())
	require.NoError(t, o.Close())
	require.ErrorIs(t, o.Close(), ErrClosed)
	got, err := clientStore(c).Get("k", nil)
	require.NoError(t, err, "reads go on after the owner is gone")
	require.Equal(t, "v", string(got))
	require.ErrorIs(t, clientStore(c).Set("k", []byte("w")), ErrOwnerGone)
	require.ErrorIs(t, clientStore(c).Remove("k"), ErrOwnerGone)
	_, err = c.Call(300, nil)
	require.ErrorIs(t, err, ErrOwnerGone)
	_, err = Attach(env.clientOpts())
	require.ErrorIs(t, err, ErrNotYetInitialized)
}

func TestRPCTimeout(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	release := make(chan struct{})
	o.Handle(400, func(req []byte) ([]byte, error) { <-release; return []byte("late"), nil })
	o.Handle(401, func(req []byte) ([]byte, error) { return []byte("prompt"), nil })
	// Attach with the default timeout (a loaded machine can take longer than 50 ms to finish
	// the handshake), then shorten the calls' timeout.
	c := attach(t, env.clientOpts())
	require.NoError(t, c.setTimeout(50*time.Millisecond))
	_, err := c.Call(400, nil)
	require.ErrorIs(t, err, ErrTimeout)
	close(release)
	// The late reply to the timed-out call is skipped by id.
	require.NoError(t, c.setTimeout(10*time.Second))
	got, err := c.Call(401, nil)
	require.NoError(t, err)
	require.Equal(t, "prompt", string(got))
}

// OnClose's functions run in Close, in the order registered, after the last handler returned
// and before the region is unmapped (they can still read it); registered after Close, a
// function runs at once.
func TestOnClose(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	_, err := o.Region().Put(storeKind, "k", []byte("v"))
	require.NoError(t, err)
	var order []string
	o.OnClose(func() {
		_, err := o.Region().Get(storeKind, "k", nil)
		order = append(order, fmt.Sprint("first, region readable: ", err == nil))
	})
	o.OnClose(func() { order = append(order, "second") })
	require.Empty(t, order)
	require.NoError(t, o.Close())
	require.Equal(t, []string{"first, region readable: true", "second"}, order)
	o.OnClose(func() { order = append(order, "late") })
	require.Equal(t, []string{"first, region readable: true", "second", "late"}, order)
}
