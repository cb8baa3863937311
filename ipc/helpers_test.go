package ipc

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/stretchr/testify/require"
)

// testRegion is small, so tests start fast.
var testRegion = shm.Config{IndexSlots: 1024, ArenaBytes: 1 << 20, ReaderSlots: 64}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// testEnv is a fresh secret and namespace, so tests never meet each other's owners.
type testEnv struct {
	secret    Secret
	secretStr string
	ns        string
}

func newTestEnv() testEnv {
	s := "test-secret-" + randHex(16)
	return testEnv{secret: NewSecret([]byte(s)), secretStr: s, ns: "ns-" + randHex(8)}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (e testEnv) ownerOpts() OwnerOptions {
	return OwnerOptions{Secret: &e.secret, Namespace: e.ns, Region: testRegion, Logger: quietLogger()}
}

func (e testEnv) clientOpts() ClientOptions {
	return ClientOptions{Secret: &e.secret, Namespace: e.ns}
}

func newTestOwner(t testing.TB, opts OwnerOptions) *Owner {
	t.Helper()
	o, err := NewOwner(opts)
	require.NoError(t, err)
	serveStore(o)
	t.Cleanup(func() { o.Close() })
	return o
}

func attach(t testing.TB, opts ClientOptions) *Client {
	t.Helper()
	c, err := Attach(opts)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func lookupEnv(k string) (string, bool) { return os.LookupEnv(k) }

// store is the transport's tests' stand-in for the rooms above ipc (package keys has the real
// key registry and its tests): values the owner writes straight into the region and clients
// read from their mapping, and writes a client sends to the owner as RPCs (storeSet,
// storeRemove), which every test owner serves (serveStore).
type store struct {
	r *shm.Region
	c *Client // nil in the owner
}

const (
	storeKind   shm.Kind = 250
	storeSet    uint16   = 0xef00 // u16 id length, id, value
	storeRemove uint16   = 0xef01 // id
)

// ownerStore is the owner's side of the store; it (re)registers the store's handlers.
func ownerStore(o *Owner) store {
	serveStore(o)
	return store{r: o.Region()}
}

// clientStore is a client's side of the store.
func clientStore(c *Client) store { return store{r: c.Region(), c: c} }

func serveStore(o *Owner) {
	s := store{r: o.Region()}
	o.Handle(storeSet, func(req []byte) ([]byte, error) {
		if len(req) < 2 || int(req[0])|int(req[1])<<8 > len(req)-2 {
			return nil, ErrProtocol
		}
		n := int(req[0]) | int(req[1])<<8
		return nil, s.Set(string(req[2:2+n]), req[2+n:])
	})
	o.Handle(storeRemove, func(req []byte) ([]byte, error) { return nil, s.Remove(string(req)) })
}

func (s store) Set(id string, v []byte) error {
	if s.c != nil {
		_, err := s.c.Call(storeSet, append(append([]byte{byte(len(id)), byte(len(id) >> 8)}, id...), v...))
		return err
	}
	_, err := s.r.Put(storeKind, id, v)
	return err
}

func (s store) Remove(id string) error {
	if s.c != nil {
		_, err := s.c.Call(storeRemove, []byte(id))
		return err
	}
	_, err := s.r.Delete(storeKind, id)
	return err
}

func (s store) Get(id string, dst []byte) ([]byte, error) { return s.r.Get(storeKind, id, dst) }

func (s store) Len() (int, error) {
	snap, err := s.r.Snapshot()
	if err != nil {
		return 0, err
	}
	defer snap.Close()
	return snap.Len(storeKind)
}
