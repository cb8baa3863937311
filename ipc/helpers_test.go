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
